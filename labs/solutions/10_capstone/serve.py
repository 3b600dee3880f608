"""Serving: write a trained model to one file, load it, and predict the next token.

The file holds every matrix as int8 with one float32 scale per output row (per channel, as lesson 05),
a quarter of float32's bytes; vectors (norms, biases) and the router, whose top-1 choice a rounding can
flip, stay float32. Loading dequantizes once: at this model's sizes a CPU multiplies float32 faster than
it runs int8 weight-only kernels, so the gain is the file's size, not the multiply.
"""
from dataclasses import asdict

import torch

from .model import LM, ModelConfig

KEEP_FLOAT = ("router",)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale per output row: the last dimension of an embedding or a Linear's
    [out, in] weight reduced, and for the experts' [experts, in, out] weights the `in` dimension."""
    dim = 1 if w.dim() == 3 else -1
    scale = w.abs().amax(dim=dim, keepdim=True).clamp(min=1e-12) / 127
    return torch.round(w / scale).clamp(-127, 127).to(torch.int8), scale


def export(model: LM, path) -> None:
    """Write what serving needs to `path`."""
    int8, fp32 = {}, {}
    for name, tensor in model.state_dict().items():
        if tensor.dim() >= 2 and not any(part in name for part in KEEP_FLOAT):
            int8[name] = quantize_rows(tensor)
        else:
            fp32[name] = tensor
    torch.save({"config": asdict(model.config), "int8": int8, "fp32": fp32}, path)


def load(path):
    """The served model, from a file that `export` wrote."""
    saved = torch.load(path, weights_only=True)
    state = dict(saved["fp32"]) | {name: q.float() * scale for name, (q, scale) in saved["int8"].items()}
    model = LM(ModelConfig(**saved["config"]))
    model.load_state_dict(state)
    return model.eval()


def next_token_logits(served, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the token after each row of `ids` ([batch, length] -> [batch, vocab_size])."""
    with torch.inference_mode():
        return served.head(served.features(ids)[:, -1])      # the head on the last position only


def generate(served, ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """`ids` followed by `new_tokens` greedy predictions."""
    for _ in range(new_tokens):
        ids = torch.cat([ids, next_token_logits(served, ids).argmax(-1, keepdim=True)], dim=1)
    return ids
