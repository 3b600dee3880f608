"""The ahead-of-time-built kernels of labs_ext::rms_norm. Importing this package imports helpers.ext
(which defines the op's schema, fake kernel, autograd and fallback) and loads the compiled library,
whose TORCH_LIBRARY_IMPL blocks add the CPU (and, where built, XPU) kernels."""
from pathlib import Path

import torch

import helpers.ext  # noqa: F401  (the schema the kernels register against)

LIBRARY = next(Path(__file__).parent.glob("_C*.*"))
torch.ops.load_library(str(LIBRARY))
