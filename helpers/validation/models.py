"""The four model definitions the pipeline measures, written out in plain PyTorch (random weights, no
downloads): a ResNet-50 (bottleneck blocks [3, 4, 6, 3]), a BERT-style encoder that accepts padded or
jagged nested input (and packed tokens for varlen attention), a DLRM (EmbeddingBag tables, dot
interactions) whose top is a mixture of experts run as one grouped GEMM where this torch runs one and as
a per-expert loop otherwise, and a Stable-Diffusion-style UNet (ResNet blocks, transformer blocks with
self- and cross-attention to a text context, GEGLU feed-forward) for one denoising step.

Weights and inputs come from numpy's PCG64 (`seed_parameters_`, `randn`), not from torch's generator,
so two torch versions build the same model and feed it the same input: their outputs can be compared.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# --- version-independent weights and inputs -----------------------------------------------------


def randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Standard-normal float32 values from numpy's PCG64: the same on every torch version."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * scale)


def seed_parameters_(model: nn.Module, seed: int) -> nn.Module:
    """Overwrite every parameter with values from numpy: constants (norm weights 1, biases 0) stay;
    a weight gets uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in its input size (as nn.Linear and
    nn.Conv2d initialise), a non-constant vector uniform(-0.05, 0.05)."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and p.numel() and bool(((p == 0) | (p == 1)).all()) and bool((p == p[0]).all()):
                continue                              # norm weights (ones) and zero biases
            if p.dim() == 3:                          # experts (E, in, out)
                fan_in = p.shape[1]
            elif p.dim() >= 2:
                fan_in = p[0].numel()
            else:
                fan_in = 400
            bound = 1 / math.sqrt(fan_in)
            p.copy_(torch.from_numpy(rng.uniform(-bound, bound, tuple(p.shape)).astype(np.float32)))
    return model


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
    key-padding mask, on a jagged nested tensor (B, j, D) with no mask at all, or on packed tokens
    (total, D) with cumulative sequence starts `cu_seq` (varlen attention, torch 2.10+)."""

    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x, attn_mask=None, cu_seq=None, max_len=None):
        d = x.size(-1)
        if cu_seq is not None:                 # packed (total, D): varlen_attn takes (total, H, D/H)
            from helpers.validation.compat import varlen_attn
            q, k, v = (t.unflatten(-1, (self.heads, d // self.heads)) for t in self.qkv(x).chunk(3, dim=-1))
            att = varlen_attn()(q, k, v, cu_seq, cu_seq, max_len, max_len).flatten(-2)
            x = self.norm1(x + self.out(att))
            return self.norm2(x + self.ffn(x))
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

    def forward(self, x, key_padding_mask=None, cu_seq=None, max_len=None):
        """key_padding_mask: (B, T) bool, True where a token is real (padded input only); cu_seq
        (B + 1,) int32 and max_len: packed input for varlen attention."""
        mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask, cu_seq, max_len)
        return x


def padded_batch(lengths: list[int], dim: int, seed: int = 0,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random token embeddings for sequences of the given lengths, padded to the longest: returns
    (x of shape (B, T_max, D) with zeros in the padding, mask (B, T_max) True on real tokens)."""
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths must be a non-empty list of positive ints, got {lengths}")
    t_max = max(lengths)
    x = randn(len(lengths), t_max, dim, seed=seed).to(device)
    mask = (torch.arange(t_max)[None, :] < torch.tensor(lengths)[:, None]).to(device)
    return x * mask[..., None], mask


def to_jagged(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The real tokens of a padded batch as a jagged nested tensor (B, j, D): no padding stored."""
    return torch.nested.as_nested_tensor([row[m] for row, m in zip(x, mask)], layout=torch.jagged)


# --- DLRM with a mixture-of-experts top ---------------------------------------------------------


class MoE(nn.Module):
    """Top-1 routed experts, each a two-layer MLP. `mode="auto"` runs every expert in one grouped GEMM
    per layer where this torch runs one (`compat.moe_path`: F.grouped_mm from 2.10, torch._grouped_mm on
    2.9) and one matmul per expert otherwise; "grouped" insists on the grouped GEMM, "loop" always loops.
    The experts compute in `expert_dtype` (their fp32 weights and the tokens cast per call, as autocast
    would; bf16 is what the CUTLASS grouped GEMM takes on a GPU); the output has the input's dtype."""

    def __init__(self, dim: int, hidden: int, experts: int, mode: str = "auto",
                 expert_dtype: torch.dtype = torch.float32):
        super().__init__()
        if mode not in ("auto", "grouped", "loop"):
            raise ValueError(f"mode must be 'auto', 'grouped' or 'loop', got {mode!r}")
        self.mode, self.experts, self.expert_dtype = mode, experts, expert_dtype
        self.router = nn.Linear(dim, experts)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / math.sqrt(dim))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / math.sqrt(hidden))

    def path(self, device_type: str) -> str:
        from helpers.validation.compat import moe_path
        if self.mode == "loop":
            return "loop"
        found = moe_path(device_type, self.expert_dtype)
        if self.mode == "grouped" and found == "loop":
            raise RuntimeError(f"this torch runs no grouped GEMM on {device_type} in {self.expert_dtype} "
                               f"(compat.moe_probes says why); use mode='auto' or 'loop'")
        return found

    def forward(self, x):
        from helpers.validation.compat import grouped_mm
        gate = self.router(x).softmax(-1)
        weight, expert = gate.max(-1)
        order = expert.argsort(stable=True)
        counts = torch.bincount(expert, minlength=self.experts)
        xs = x[order].to(self.expert_dtype)
        w1, w2 = self.w1.to(self.expert_dtype), self.w2.to(self.expert_dtype)
        path = self.path(x.device.type)
        if path != "loop":
            offs = counts.cumsum(0).to(torch.int32)            # cumulative END offsets, int32
            h = F.gelu(grouped_mm(xs, w1, offs, path))
            ys = grouped_mm(h, w2, offs, path)
        else:
            chunks = xs.split(counts.tolist())
            ys = torch.cat([F.gelu(c @ w1[e]) @ w2[e] for e, c in enumerate(chunks)])
        y = torch.empty_like(ys).index_copy(0, order, ys).to(x.dtype)
        return x + y * weight[:, None]


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019): dense features -> bottom MLP; each sparse feature -> an EmbeddingBag
    (sum over its ids; sparse gradients, as DLRM trains its tables); pairwise dot-product interaction;
    top: a projection, a mixture of experts, a logit."""

    def __init__(self, dense: int, tables: int, rows: int, dim: int, experts: int, hidden: int,
                 mode: str = "auto", sparse: bool = True, expert_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse) for _ in range(tables))
        n = tables + 1
        self.register_buffer("pairs", torch.triu_indices(n, n, offset=1), persistent=False)
        inter = dim + n * (n - 1) // 2
        self.project = nn.Linear(inter, dim)
        self.moe = MoE(dim, hidden, experts, mode, expert_dtype)
        self.head = nn.Linear(dim, 1)

    def forward(self, dense, ids, offsets):
        """dense (B, dense); ids: one flat id tensor per table; offsets: where each sample's bag starts."""
        z = self.bottom(dense)
        feats = torch.stack([z] + [t(i, o) for t, i, o in zip(self.tables, ids, offsets)], dim=1)
        dots = feats @ feats.transpose(1, 2)
        inter = dots[:, self.pairs[0], self.pairs[1]]
        h = F.relu(self.project(torch.cat([z, inter], dim=1)))
        return self.head(self.moe(h)).squeeze(-1)


def dlrm_batch(batch: int, dense: int, tables: int, rows: int, bag: int, seed: int = 0,
               device: torch.device | str = "cpu"):
    """A random batch (numpy PCG64): dense features, per table a flat id tensor with bags of 1..bag ids
    (ids skewed towards low rows, as real categorical features are), offsets, labels."""
    rng = np.random.default_rng(seed)
    sizes = [rng.integers(1, bag + 1, batch) for _ in range(tables)]
    ids = [torch.from_numpy(np.minimum(rng.zipf(1.2, int(s.sum())) - 1, rows - 1)).to(device) for s in sizes]
    offsets = [torch.from_numpy(np.concatenate([[0], np.cumsum(s)[:-1]])).to(device) for s in sizes]
    labels = torch.from_numpy(rng.integers(0, 2, batch).astype(np.float32)).to(device)
    dense_x = torch.from_numpy(rng.standard_normal((batch, dense), dtype=np.float32)).to(device)
    return dense_x, ids, offsets, labels


# --- Stable-Diffusion-style UNet (one denoising step) ----------------------------------------------


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, t_dim: int, groups: int = 8):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, c_in), nn.Conv2d(c_in, c_out, 3, padding=1)
        self.time = nn.Linear(t_dim, c_out)
        self.norm2, self.conv2 = nn.GroupNorm(groups, c_out), nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x))) + self.time(F.silu(t))[:, :, None, None]
        return self.skip(x) + self.conv2(F.silu(self.norm2(h)))


class Attention(nn.Module):
    """Multi-head attention; with `context_dim` it is cross-attention (keys and values from the text)."""

    def __init__(self, dim: int, heads: int, context_dim: int | None = None):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(context_dim or dim, 2 * dim, bias=False)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, context=None):
        ctx = x if context is None else context
        d = x.size(-1) // self.heads
        q = self.q(x).unflatten(-1, (self.heads, d)).transpose(1, 2)
        k, v = (t.unflatten(-1, (self.heads, d)).transpose(1, 2) for t in self.kv(ctx).chunk(2, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class TransformerBlock(nn.Module):
    """Stable Diffusion's spatial transformer: norm, proj_in, [self-attention, cross-attention to the
    text context, GEGLU feed-forward] with pre-norm residuals, proj_out, residual."""

    def __init__(self, channels: int, heads: int, context_dim: int, groups: int = 8):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels)
        self.proj_in, self.proj_out = nn.Linear(channels, channels), nn.Linear(channels, channels)
        self.n1, self.n2, self.n3 = nn.LayerNorm(channels), nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.self_attn = Attention(channels, heads)
        self.cross_attn = Attention(channels, heads, context_dim)
        self.geglu = nn.Linear(channels, 8 * channels)
        self.ff_out = nn.Linear(4 * channels, channels)

    def forward(self, x, context):
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x).flatten(2).transpose(1, 2))          # (B, HW, C)
        t = t + self.self_attn(self.n1(t))
        t = t + self.cross_attn(self.n2(t), context)
        a, gate = self.geglu(self.n3(t)).chunk(2, dim=-1)
        t = t + self.ff_out(a * F.gelu(gate))
        return x + self.proj_out(t).transpose(1, 2).reshape(b, c, h, w)


class UNet(nn.Module):
    """The layout of Stable Diffusion's UNet (v1: channel_mult (1, 2, 4, 4), attention at the three
    highest resolutions, context 768) at a configurable size: per level a ResBlock and, where `attention`
    says so, a transformer block; a middle ResBlock-transformer-ResBlock; the mirror path up with skips.
    `channels=320, mult=(1, 2, 4, 4), attention=(1, 1, 1, 0), context_dim=768` is SD v1's shape (one
    block per level where SD has two)."""

    def __init__(self, channels: int = 64, mult=(1, 2), attention=(1, 1), heads: int = 8,
                 context_dim: int = 768, in_channels: int = 4):
        super().__init__()
        c, t_dim = channels, 4 * channels
        self.time = nn.Sequential(nn.Linear(c, t_dim), nn.SiLU(), nn.Linear(t_dim, t_dim))
        self.inp = nn.Conv2d(in_channels, c, 3, padding=1)
        widths = [c * m for m in mult]
        self.down, self.down_attn, self.downsample = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        prev = c
        for i, (wd, att) in enumerate(zip(widths, attention)):
            self.down.append(ResBlock(prev, wd, t_dim))
            self.down_attn.append(TransformerBlock(wd, heads, context_dim) if att else nn.Identity())
            self.downsample.append(nn.Conv2d(wd, wd, 3, stride=2, padding=1) if i < len(widths) - 1
                                   else nn.Identity())
            prev = wd
        self.mid1, self.mid_attn, self.mid2 = (ResBlock(prev, prev, t_dim), TransformerBlock(prev, heads, context_dim),
                                               ResBlock(prev, prev, t_dim))
        self.up, self.up_attn = nn.ModuleList(), nn.ModuleList()
        for i, (wd, att) in reversed(list(enumerate(zip(widths, attention)))):
            self.up.append(ResBlock(prev + wd, wd, t_dim))
            self.up_attn.append(TransformerBlock(wd, heads, context_dim) if att else nn.Identity())
            prev = wd
        self.outp = nn.Sequential(nn.GroupNorm(8, prev), nn.SiLU(), nn.Conv2d(prev, in_channels, 3, padding=1))

    def timestep_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.inp.out_channels // 2
        freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
        args = t[:, None].float() * freqs[None]
        return self.time(torch.cat([args.cos(), args.sin()], dim=-1))

    def _attend(self, block, h, context):
        return h if isinstance(block, nn.Identity) else block(h, context)

    def forward(self, x, t, context):
        temb = self.timestep_embedding(t)
        h, skips = self.inp(x), []
        for res, att, down in zip(self.down, self.down_attn, self.downsample):
            h = self._attend(att, res(h, temb), context)
            skips.append(h)
            h = down(h)
        h = self.mid2(self._attend(self.mid_attn, self.mid1(h, temb), context), temb)
        for res, att in zip(self.up, self.up_attn):
            skip = skips.pop()
            if h.shape[-1] != skip.shape[-1]:
                h = F.interpolate(h, size=skip.shape[-2:], mode="nearest")
            h = self._attend(att, res(torch.cat([h, skip], dim=1), temb), context)
        return self.outp(h)
