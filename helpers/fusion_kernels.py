"""The Triton kernels of helpers.fusion. Imported on first use by helpers.fusion, never at start-up:
`triton.jit` reads TRITON_INTERPRET when this module is imported (set it first to run on a CPU), and
Triton resolves the names a kernel calls (apply_part) among this module's globals, so the kernels
live at module level here rather than inside a function."""
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

INTERPRETED = bool(triton.knobs.runtime.interpret)   # how these kernels were built
# triton.language's own helpers (tl.cdiv, tl.sigmoid, ...) are jit functions too, built when triton was
# first imported: if that happened before TRITON_INTERPRET=1 was set, interpreted kernels cannot call them.
LANGUAGE_INTERPRETED = isinstance(tl.standard.cdiv, InterpretedFunction)


@triton.jit
def apply_part(x_ptr, y_ptr, n, local_pid, alpha, PART: tl.constexpr, BLOCK: tl.constexpr):
    """One block of one part: op PART on elements local_pid*BLOCK ... local_pid*BLOCK + BLOCK - 1."""
    offsets = local_pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    if PART == 0:
        y = x * alpha                       # scale
    elif PART == 1:
        y = tl.maximum(x, 0.0)              # relu
    else:
        y = x * tl.sigmoid(x)               # silu
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def combo_kernel(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):
    """Three independent elementwise ops in one launch: the program id picks the part, as in
    Inductor's sequential dispatch (num_xblocks_0, num_xblocks_1, ... then if pid < ...: elif ...)."""
    pid = tl.program_id(0)
    end0 = tl.cdiv(n0, BLOCK)
    end1 = end0 + tl.cdiv(n1, BLOCK)
    if pid < end0:
        apply_part(x0, y0, n0, pid, alpha, 0, BLOCK)
    elif pid < end1:
        apply_part(x1, y1, n1, pid - end0, alpha, 1, BLOCK)
    else:
        apply_part(x2, y2, n2, pid - end1, alpha, 2, BLOCK)


@triton.jit
def combo_kernel_round_robin(x0, y0, n0, x1, y1, n1, x2, y2, n2, alpha, BLOCK: tl.constexpr):
    """The same three ops in one launch, dispatched round-robin as Inductor does when the parts have
    similar sizes (if pid % N == i: pid_offset = pid // N): a part with fewer blocks gets masked programs."""
    pid = tl.program_id(0)
    local_pid = pid // 3
    if pid % 3 == 0:
        apply_part(x0, y0, n0, local_pid, alpha, 0, BLOCK)
    elif pid % 3 == 1:
        apply_part(x1, y1, n1, local_pid, alpha, 1, BLOCK)
    else:
        apply_part(x2, y2, n2, local_pid, alpha, 2, BLOCK)


@triton.jit
def single_kernel(x, y, n, alpha, PART: tl.constexpr, BLOCK: tl.constexpr):
    """One part per launch: the baseline that a combo kernel replaces."""
    apply_part(x, y, n, tl.program_id(0), alpha, PART, BLOCK)
