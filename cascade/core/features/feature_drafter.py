"""A drafter that reads the target's hidden states (EAGLE-3 style): one decoder layer on top of
the target's own features.

Vocabulary (position t holds token x_t; the target's feature g_t is what it computed there, and
predicts x_{t+1}):

- **fused feature** g_t = fuse(concat of the target's hidden states at a low, a middle and a high
  layer at position t)  # [hidden]
- **step input** at position t: fc(concat(norm(embed(x_{t+1})), norm(g_t)))  # [hidden]; the
  decoder layer's output a_t predicts x_{t+2} through the target's final norm and head.
- **drafting**: the first drafted token comes from the last committed position's target
  feature; every later one feeds the drafter's own output a_t in place of g_t (EAGLE's rule).
- **training-time test (TTT)**: training unrolls the same substitution for ``num_steps`` steps,
  so that step j sees exactly the inputs and attention context drafting gives it (see
  ``unrolled_logits``).

The embedding and the output head are the target's, frozen; the head keeps only the rows of a
frequent-token vocabulary (``vocab_ids``), so the drafter never proposes a token outside it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from cascade.core.kv.kv_store import attention_heads


@dataclass(frozen=True)
class FeatureDrafterConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    feature_layers: tuple[int, ...]
    """Indices into the target's ``hidden_states`` output (0 = embeddings) that are fused."""
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def for_target(cls, target_config) -> FeatureDrafterConfig:
        """Shaped like one layer of the target; low, middle and high layers fused (EAGLE-3)."""
        c = target_config
        layers, hidden = c.num_hidden_layers, c.hidden_size
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))
        heads, kv_heads, _ = attention_heads(c)
        inner = getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * hidden
        eps = getattr(c, "rms_norm_eps", None) or 1e-5
        picked = sorted({min(3, layers), layers // 2 + 1, max(layers - 2, 1)})
        return cls(hidden, heads, kv_heads, inner, tuple(picked), eps, float(theta))

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (half-split, as Llama). x: [..., T, head_dim]; positions: [T]."""
    half = x.shape[-1] // 2
    freqs = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.float()[:, None] * freqs[None, :]  # [T, half]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DecoderLayer(nn.Module):
    """A Llama decoder layer whose attention takes explicit key/value sets (for TTT and cache)."""

    def __init__(self, c: FeatureDrafterConfig) -> None:
        super().__init__()
        self.c = c
        d, kv = c.hidden_size, c.num_kv_heads * c.head_dim
        self.attn_norm = RMSNorm(d, c.rms_norm_eps)
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=False), nn.Linear(d, kv, bias=False)
        self.v_proj, self.o_proj = nn.Linear(d, kv, bias=False), nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d, c.rms_norm_eps)
        self.gate = nn.Linear(d, c.intermediate_size, bias=False)
        self.up = nn.Linear(d, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, d, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor):
        """x: [B, T, d] -> q [B, H, T, hd], k and v [B, Hkv, T, hd] (rotary applied)."""
        c, (batch, length, _) = self.c, x.shape
        h = self.attn_norm(x)
        q = self.q_proj(h).view(batch, length, c.num_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(batch, length, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return rope(q, positions, c.rope_theta), rope(k, positions, c.rope_theta), v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """attended: [B, H, T, hd] -> the layer's output [B, T, d]."""
        batch, _, length, _ = attended.shape
        x = x + self.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))

    def expand_kv(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.c.num_heads // self.c.num_kv_heads, dim=1)


class FeatureDrafter(nn.Module):
    def __init__(self, c: FeatureDrafterConfig, embed_weight: torch.Tensor,
                 head_weight: torch.Tensor, vocab_ids: torch.Tensor) -> None:
        """embed_weight: [target vocab, d]; head_weight: [target vocab, d] (frozen, shared
        with the target); vocab_ids: [V'] target ids the head keeps."""
        super().__init__()
        self.c = c
        d = c.hidden_size
        self.fuse = nn.Linear(len(c.feature_layers) * d, d, bias=False)
        self.embed_norm, self.feature_norm = RMSNorm(d, c.rms_norm_eps), RMSNorm(d, c.rms_norm_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layer = DecoderLayer(c)
        self.norm = RMSNorm(d, c.rms_norm_eps)
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.long(), persistent=True)
        self.register_buffer("head_weight", head_weight.detach()[vocab_ids.long()],
                             persistent=False)

    def fuse_features(self, stacked: torch.Tensor) -> torch.Tensor:
        """stacked: [..., len(feature_layers) * d] target hidden states -> g [..., d]."""
        return self.fuse(stacked.to(self.fuse.weight.dtype))

    def step_input(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """features [B, T, d] (g or the drafter's own a), next_tokens [B, T] -> [B, T, d]."""
        embedded = F.embedding(next_tokens, self.embed_weight).to(features.dtype)
        return self.fc(torch.cat([self.embed_norm(embedded), self.feature_norm(features)], -1))

    def head(self, a: torch.Tensor) -> torch.Tensor:
        """a [..., d] -> logits over the kept vocabulary [..., V'] (local ids)."""
        return self.norm(a) @ self.head_weight.to(a.dtype).T

    def unrolled_states(self, fused: torch.Tensor, next_tokens: torch.Tensor,
                        num_steps: int) -> list[torch.Tensor]:
        """Training-time test: the layer's output a [B, T, d] for each of ``num_steps``
        drafting steps (``head`` turns one into logits).

        fused: [B, T, d] target features g_t; next_tokens: [B, T] x_{t+1}. Step j at position t
        feeds the drafter's own output of step j-1 at t-1 (step 1 feeds g_t), and attends to
        step-1 keys at positions <= t-j+1 plus step-m keys at t-j+m for m = 2..j: exactly the
        context drafting gives the j-th token drafted after committed position t-j+1.
        Positions t < j-1 have no such base and must be masked out of the loss."""
        length = fused.shape[1]
        positions = torch.arange(length, device=fused.device)
        features, keys, values, outputs = fused, [], [], []
        for step in range(1, num_steps + 1):
            x = self.step_input(features, next_tokens)
            q, k, v = self.layer.qkv(x, positions)
            keys.append(self.layer.expand_kv(k))
            values.append(self.layer.expand_kv(v))
            a = self.layer.finish(x, _ttt_attention(q, keys, values, step))
            outputs.append(a)
            features = F.pad(a, (0, 0, 1, 0))[:, :-1]  # a_{t-1} feeds position t next step
        return outputs

    def unrolled_logits(self, fused: torch.Tensor, next_tokens: torch.Tensor,
                        num_steps: int) -> list[torch.Tensor]:
        """``unrolled_states`` through the head: [B, T, V'] per step."""
        return [self.head(a) for a in self.unrolled_states(fused, next_tokens, num_steps)]


def _ttt_attention(q: torch.Tensor, keys: list, values: list, step: int) -> torch.Tensor:
    """q: [B, H, T, hd]; keys/values: one [B, H, T, hd] per step so far -> [B, H, T, hd]."""
    length, scale = q.shape[2], 1.0 / math.sqrt(q.shape[-1])
    t = torch.arange(length, device=q.device)
    base = (q @ keys[0].transpose(-1, -2)) * scale  # [B, H, T, T]
    allowed = t[None, :] <= (t[:, None] - (step - 1))
    scores = [base.masked_fill(~allowed, float("-inf"))]
    shifted_values = [values[0]]
    for m in range(2, step + 1):  # the step-m key at position t - (step - m)
        shift = step - m
        k_m = F.pad(keys[m - 1], (0, 0, shift, 0))[:, :, :length]
        v_m = F.pad(values[m - 1], (0, 0, shift, 0))[:, :, :length]
        diag = (q * k_m).sum(-1, keepdim=True) * scale  # [B, H, T, 1]
        scores.append(diag.masked_fill((t < shift)[None, None, :, None], float("-inf")))
        shifted_values.append(v_m)
    weights = torch.softmax(torch.cat(scores, -1).float(), -1).to(q.dtype)
    # rows with no allowed key (t < step - 1) give NaN-free zeros after nan_to_num
    weights = torch.nan_to_num(weights)
    out = weights[..., :length] @ shifted_values[0]
    for i, v_m in enumerate(shifted_values[1:]):
        out = out + weights[..., length + i : length + i + 1] * v_m
    return out


def save_config(config: FeatureDrafterConfig) -> dict:
    return {"kind": "feature", **config.to_dict()}


def load_config(data: dict) -> FeatureDrafterConfig:
    """The drafter's shape from its config.json (other keys, such as the target's name, are
    descriptions)."""
    names = {f.name for f in fields(FeatureDrafterConfig)}
    values = {k: v for k, v in data.items() if k in names}
    values["feature_layers"] = tuple(values["feature_layers"])
    return FeatureDrafterConfig(**values)
