"""A small decoder-only transformer whose feed-forward layers are a mixture of experts.

Each block: x + attention(norm(x)), then x + experts(norm(x)). Attention is causal: a position attends
to itself and the positions before it. The experts layer routes each token to its top-1 expert (a
softmax router) and scales that expert's output by the router's probability.
"""
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class ModelConfig:
    vocab_size: int = 512
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    n_experts: int = 4
    d_ff: int = 128
    max_len: int = 128


@torch.jit.script
def gelu(x):
    # GELU's tanh approximation, scripted so that TorchScript fuses it
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(self, x):
        batch, length, width = x.shape
        head = width // self.n_heads
        q, k, v = self.qkv(x).view(batch, length, 3, self.n_heads, head).permute(2, 0, 3, 1, 4)
        # each position attends to itself and the positions before it
        allowed = torch.ones(length, length, dtype=torch.bool).tril(diagonal=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(head)
        scores = scores.masked_fill(~allowed, float("-inf"))
        y = scores.softmax(dim=-1) @ v
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
        counts = torch.bincount(expert, minlength=self.w_in.shape[0])
        padded = x.new_zeros(self.w_in.shape[0], int(counts.max()), x.shape[-1])
        rows = []
        for e in range(self.w_in.shape[0]):
            rows.append((expert == e).nonzero().squeeze(1))
            if rows[e].numel():
                padded[e, :rows[e].numel()] = x[rows[e]]
        out = torch.bmm(gelu(torch.bmm(padded, self.w_in)), self.w_out)
        y = torch.zeros_like(x)
        for e in range(self.w_in.shape[0]):
            if rows[e].numel():
                y[rows[e]] = out[e, :rows[e].numel()]
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
            x = block(x)
        return self.norm(x)

    def forward(self, ids):
        """Next-token logits at every position, [batch, length, vocab_size]."""
        return self.head(self.features(ids))


def build_model(config: ModelConfig, seed: int) -> LM:
    """The model with its parameters drawn from torch's global generator seeded with `seed`."""
    torch.manual_seed(seed)
    return LM(config)
