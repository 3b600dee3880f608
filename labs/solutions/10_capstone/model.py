"""A small decoder-only transformer whose feed-forward layers are a mixture of experts.

Each block: x + attention(norm(x)), then x + experts(norm(x)). Attention is causal: a position attends
to itself and the positions before it. The experts layer routes each token to its top-1 expert (a
softmax router) and scales that expert's output by the router's probability.

The parameters, their names and the order they are drawn in are the starting code's, so a seed gives
the same initial model; only the computation changed.
"""
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass
class ModelConfig:
    vocab_size: int = 512
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    n_experts: int = 4
    d_ff: int = 128
    max_len: int = 128


# F.grouped_mm (public in 2.10) runs float32 on a CPU, but its meta function, which torch.compile traces
# with, accepts only bfloat16 there (torch/_meta_registrations.py, _meta_grouped_mm_common, 2.10.0):
# wrapped in custom ops with their own fake kernels, the experts trace without a graph break. Op names are
# global to the process, so each loaded copy of this module registers its own namespace.
OPS = "capstone_" + re.sub(r"\W", "_", __name__)


@torch.library.custom_op(f"{OPS}::expert_mm", mutates_args=())
def expert_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows offs[e-1]:offs[e] of x [rows, k] times w[e] [k, n]; offs are the int32 END offsets per expert."""
    return F.grouped_mm(x, w, offs=offs)


@expert_mm.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[-1])


@torch.library.custom_op(f"{OPS}::expert_weight_grad", mutates_args=())
def expert_weight_grad(x: torch.Tensor, dy: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Per expert, its rows of x transposed times its rows of dy: [experts, k, n]."""
    return F.grouped_mm(x.t(), dy, offs=offs)


@expert_weight_grad.register_fake
def _(x, dy, offs):
    return x.new_empty(offs.shape[0], x.shape[1], dy.shape[1])


def _expert_mm_backward(ctx, dy):
    x, w, offs = ctx.saved_tensors
    dy = dy.contiguous()        # grouped_mm refuses a broadcast gradient (stride 0)
    return expert_mm(dy, w.transpose(-2, -1), offs), expert_weight_grad(x, dy, offs), None


def _expert_mm_save(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


expert_mm.register_autograd(_expert_mm_backward, setup_context=_expert_mm_save)


def grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """expert_mm while torch.compile traces; in eager, F.grouped_mm itself (its own backward), because at these
    sizes a custom op's Python dispatch costs more than the GEMMs it runs."""
    if torch.compiler.is_compiling():
        return expert_mm(x, w, offs)
    return F.grouped_mm(x, w, offs=offs)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)
        # is_causal: no mask tensor to build, and (on a CPU) the flash kernel, which works through the scores
        # block by block instead of holding all [length, length] of them for backward
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class Experts(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(config.n_experts, config.d_model, config.d_ff) * config.d_model ** -0.5)
        self.w_out = nn.Parameter(torch.randn(config.n_experts, config.d_ff, config.d_model) * config.d_ff ** -0.5)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        gate, expert = self.router(x).softmax(dim=-1).max(dim=-1)
        # tokens sorted by expert, each expert's rows one group: no padding, no host synchronisation
        order = torch.argsort(expert, stable=True)
        counts = torch.zeros(self.w_in.shape[0], dtype=torch.long).scatter_add_(0, expert, torch.ones_like(expert))
        offs = counts.cumsum(0).to(torch.int32)
        hidden = F.gelu(grouped(x[order], self.w_in, offs), approximate="tanh")
        y = torch.empty_like(x).index_copy_(0, order, grouped(hidden, self.w_out, offs))
        return (y * gate.unsqueeze(-1)).reshape(shape)


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attention = Attention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.experts = Experts(config)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.experts(self.norm2(x))


class LM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.position = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def features(self, ids):
        """The final normalised hidden states, [batch, length, d_model]."""
        x = self.embed(ids) + self.position(torch.arange(ids.shape[1]))
        for block in self.blocks:
            # in training, keep only each block's input for backward and recompute the rest
            x = checkpoint(block, x, use_reentrant=False) if self.training else block(x)
        return self.norm(x)

    def forward(self, ids):
        """Next-token logits at every position, [batch, length, vocab_size]."""
        return self.head(self.features(ids))


def build_model(config: ModelConfig, seed: int) -> LM:
    """The model with its parameters drawn from a generator seeded with `seed` (torch's global generator,
    restored afterwards)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LM(config)
