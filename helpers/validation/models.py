"""The four model definitions the pipeline measures, written out in plain PyTorch (random weights, no
downloads): a ResNet-50 (bottleneck blocks [3, 4, 6, 3]), a BERT-style encoder that accepts padded or
jagged nested input, a DLRM-style recommender whose top MLP is a mixture of experts run with
`torch.nn.functional.grouped_mm`, and a small UNet with a self-attention block (one diffusion step).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# --- ResNet-50 ---------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int = 1):
        super().__init__()
        c_out = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.Conv2d(width, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes: int = 1000, base_width: int = 64) -> nn.Module:
    """ResNet-50 (He et al. 2015, v1.5: stride in the 3x3 conv). base_width=64 is the real network
    (25.6 M parameters with 1000 classes); smaller widths keep the depth and layout for quick runs."""
    if base_width < 1:
        raise ValueError(f"base_width must be >= 1, got {base_width}")
    layers = [nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(base_width),
              nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1)]
    c_in = base_width
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = base_width * 2 ** stage
        for i in range(blocks):
            layers.append(Bottleneck(c_in, width, stride=2 if i == 0 and stage > 0 else 1))
            c_in = width * Bottleneck.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


# --- BERT-style encoder (padded or jagged input) -----------------------------------------------


class EncoderLayer(nn.Module):
    """Post-norm transformer encoder layer (as in BERT). Works on a padded (B, T, D) tensor with a
    key-padding mask, or on a jagged nested tensor (B, j, D) with no mask at all."""

    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x, attn_mask=None):
        d = x.size(-1)
        # (B, T, D) -> (B, H, T, D/H); for a jagged tensor T is the ragged dimension. Jagged SDPA
        # needs each of q, k, v contiguous before the transpose, hence the copy after chunk.
        q, k, v = (t.contiguous().unflatten(-1, (self.heads, d // self.heads)).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        att = att.transpose(1, 2).flatten(-2)
        x = self.norm1(x + self.out(att))
        return self.norm2(x + self.ffn(x))


class Encoder(nn.Module):
    def __init__(self, dim: int = 768, layers: int = 12, heads: int = 12, ffn: int = 3072):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(dim, heads, ffn) for _ in range(layers))

    def forward(self, x, key_padding_mask=None):
        """key_padding_mask: (B, T) bool, True where a token is real (padded input only)."""
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x


def padded_batch(lengths: list[int], dim: int, generator: torch.Generator | None = None,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token embeddings for sequences of the given lengths, padded to the longest: returns
    (x of shape (B, T_max, D) with zeros in the padding, mask (B, T_max) True on real tokens)."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths}")
    t_max = max(lengths)
    x = torch.randn(len(lengths), t_max, dim, generator=generator).to(device)
    mask = (torch.arange(t_max)[None, :] < torch.tensor(lengths)[:, None]).to(device)
    return x * mask[..., None], mask


def to_jagged(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real tokens of a padded batch as a jagged nested tensor (B, j, D): no padding stored."""
    return torch.nested.as_nested_tensor([row[m] for row, m in zip(x, mask)], layout=torch.jagged)


# --- DLRM-style model with a mixture-of-experts top MLP -----------------------------------------


class MoE(nn.Module):
    """Top-1 routed experts, each a two-layer MLP. `mode="grouped"` sorts tokens by expert and runs
    every expert in one `F.grouped_mm` per layer; `mode="loop"` runs one matmul per expert."""

    def __init__(self, dim: int, hidden: int, experts: int, mode: str = "grouped"):
        super().__init__()
        if mode not in ("grouped", "loop"):
            raise ValueError(f"mode must be 'grouped' or 'loop', got {mode!r}")
        self.mode, self.experts = mode, experts
        self.router = nn.Linear(dim, experts)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / math.sqrt(hidden))

    def forward(self, x):
        gate = self.router(x).softmax(-1)
        weight, expert = gate.max(-1)
        order = expert.argsort()
        counts = torch.bincount(expert, minlength=self.experts)
        xs = x[order]
        if self.mode == "grouped":
            offs = counts.cumsum(0).to(torch.int32)            # cumulative END offsets, int32
            h = F.gelu(F.grouped_mm(xs, self.w1, offs=offs))
            ys = F.grouped_mm(h, self.w2, offs=offs)
        else:
            chunks = xs.split(counts.tolist())
            ys = torch.cat([F.gelu(c @ self.w1[e]) @ self.w2[e] for e, c in enumerate(chunks)])
        y = torch.empty_like(ys).index_copy(0, order, ys)
        return x + y * weight[:, None]


class DLRM(nn.Module):
    """Dense features -> bottom MLP; each sparse feature -> an EmbeddingBag (sum over its ids);
    pairwise dot-product interaction; top: a mixture of experts, then a logit."""

    def __init__(self, dense: int, tables: int, rows: int, dim: int, experts: int, hidden: int,
                 mode: str = "grouped"):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        n = tables + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        inter = dim + n * (n - 1) // 2
        self.project = nn.Linear(inter, dim)
        self.moe = MoE(dim, hidden, experts, mode)
        self.head = nn.Linear(dim, 1)

    def forward(self, dense, ids, offsets):
        """dense (B, dense); ids: one flat id tensor per table; offsets: where each sample's bag starts."""
        z = self.bottom(dense)
        feats = torch.stack([z] + [t(i, o) for t, i, o in zip(self.tables, ids, offsets)], dim=1)
        dots = feats @ feats.transpose(1, 2)
        inter = dots[:, self.pairs[0], self.pairs[1]]
        h = F.relu(self.project(torch.cat([z, inter], dim=1)))
        return self.head(self.moe(h)).squeeze(-1)


def dlrm_batch(batch: int, dense: int, tables: int, rows: int, bag: int,
               generator: torch.Generator | None = None, device: torch.device | str = "cpu"):
    """A random batch: dense features, per table a flat id tensor with bags of 1..bag ids, offsets, labels."""
    sizes = [torch.randint(1, bag + 1, (batch,), generator=generator) for _ in range(tables)]
    ids = [torch.randint(0, rows, (int(s.sum()),), generator=generator).to(device) for s in sizes]
    offsets = [torch.cat([torch.zeros(1, dtype=torch.long), s.cumsum(0)[:-1]]).to(device) for s in sizes]
    labels = torch.randint(0, 2, (batch,), generator=generator).float().to(device)
    return torch.randn(batch, dense, generator=generator).to(device), ids, offsets, labels


# --- UNet with self-attention (one denoising step) -----------------------------------------------


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, t_dim: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, c_in), nn.Conv2d(c_in, c_out, 3, padding=1)
        self.time = nn.Linear(t_dim, c_out)
        self.norm2, self.conv2 = nn.GroupNorm(8, c_out), nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class AttentionBlock(nn.Module):
    """Self-attention over the H*W positions of a feature map (as in Stable Diffusion's UNet)."""

    def __init__(self, channels: int, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(8, channels)
        self.qkv, self.out = nn.Linear(channels, 3 * channels), nn.Linear(channels, channels)

    def forward(self, x):
        b, c, h, w = x.shape
        tokens = self.norm(x).flatten(2).transpose(1, 2)                  # (B, HW, C)
        q, k, v = (t.unflatten(-1, (self.heads, c // self.heads)).transpose(1, 2)
                   for t in self.qkv(tokens).chunk(3, dim=-1))
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        return x + self.out(att).transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    """Two resolutions, attention at the lower one: down, middle (res, attention, res), up with a skip."""

    def __init__(self, channels: int = 64, in_channels: int = 4, heads: int = 4):
        super().__init__()
        c, t_dim = channels, 4 * channels
        self.t_dim = t_dim
        self.time = nn.Sequential(nn.Linear(c, t_dim), nn.SiLU(), nn.Linear(t_dim, t_dim))
        self.inp = nn.Conv2d(in_channels, c, 3, padding=1)
        self.down1, self.downsample = ResBlock(c, c, t_dim), nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.mid1, self.attn, self.mid2 = ResBlock(c, 2 * c, t_dim), AttentionBlock(2 * c, heads), \
            ResBlock(2 * c, 2 * c, t_dim)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.up1 = ResBlock(3 * c, c, t_dim)
        self.outp = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, in_channels, 3, padding=1))

    def timestep_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.inp.out_channels // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return self.time(torch.cat([args.cos(), args.sin()], dim=-1))

    def forward(self, x, t):
        temb = self.timestep_embedding(t)
        skip = self.down1(self.inp(x), temb)
        h = self.mid2(self.attn(self.mid1(self.downsample(skip), temb)), temb)
        h = self.up1(torch.cat([self.up(h), skip], dim=1), temb)
        return self.outp(h)
