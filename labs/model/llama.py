# Generated from solutions/model/llama.py by tools/make_labs.py: fill in each NotImplementedError.
"""A Llama-architecture decoder in plain PyTorch, over flat token batches.

The model never sees padding or batch dimensions: a step's tokens from every sequence arrive as one
flat ``[T]`` vector with their positions, and attention is delegated to an ``attend`` callable that
owns the KV cache and knows which tokens belong to which sequence (vLLM's design). That keeps this
file about the model's math alone:

    x = embed(ids)
    for each layer:  x = x + o_proj(attention(rope(q), rope(k), v))     q, k, v = qkv_proj(rms_norm(x))
                     x = x + down_proj(silu(gate) * up)                  gate, up = gate_up_proj(rms_norm(x))
    logits = lm_head(rms_norm(x))

Q/K/V and gate/up projections are fused into one matrix each, so a decode step reads each layer's
weights in four matrix-vector products.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import gqa_attention
from .config import ModelConfig


class Attend(Protocol):
    """Writes this step's K/V for ``layer`` into the cache and attends: q ``[T, Hq, D]`` -> ``[T, Hq, D]``."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension, computed in float32.

    ``y = x / sqrt(mean(x**2) + eps) * weight``; the result has ``x``'s dtype.
    """
    raise NotImplementedError("Lab 0: y = x / RMS(x) * weight over the last dim; compute in float32, return x's dtype (hints: make hint LAB=0)")


def rope_tables(head_dim: int, theta: float, max_positions: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_positions, head_dim]`` for rotate-half RoPE.

    Frequency ``i`` (of ``head_dim / 2``) is ``theta ** (-2i / head_dim)``; each is repeated for both
    halves of the head, matching Hugging Face's layout.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    angles = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each head of ``x`` ``[T, H, D]`` by its token's angles (``cos``, ``sin``: ``[T, D]``).

    Rotate-half convention: dimension ``j`` pairs with ``j + D/2``, so for each pair
    ``(a, b) -> (a cos - b sin, b cos + a sin)``.
    """
    raise NotImplementedError("Lab 0: rotate dimension pair (j, j + D/2) of every head by its token's angle (hints: make hint LAB=0)")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        tokens, rotated_heads = x.shape[0], self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x).view(tokens, rotated_heads + self.num_kv_heads, self.head_dim)
        # Q and K heads sit side by side in the fused projection: rotate them in one call.
        q, k = apply_rope(qkv[:, :rotated_heads], cos, sin).split([self.num_heads, self.num_kv_heads], dim=1)
        out = attend(self.layer, q, k, qkv[:, rotated_heads:])
        return self.o_proj(out.reshape(tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Token ids and positions in, final hidden states out; ``logits`` applies the LM head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """``input_ids``, ``positions``: ``[T]``. Returns hidden states ``[T, hidden]`` (before the final norm)."""
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attend)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 next-token logits ``[N, vocab]`` for the given hidden states."""
        return self.lm_head(self.norm(hidden)).float()

    def sequence_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[L, vocab]`` at every position of one sequence ``[L]``, with no KV cache (for scoring)."""

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            heads_first = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            return gqa_attention(*heads_first, causal=True)[0].transpose(0, 1)

        positions = torch.arange(input_ids.shape[0], device=input_ids.device)
        return self.logits(self(input_ids, positions, attend))

    @classmethod
    def from_state_dict(
        cls, config: ModelConfig, state_dict: dict[str, torch.Tensor], device: str | torch.device, dtype: torch.dtype
    ) -> LlamaModel:
        """Build on the meta device, then assign weights in Hugging Face Llama naming (fusing Q/K/V, gate/up)."""
        with torch.device("meta"):
            model = cls(config)
        fused = fuse_projections(state_dict, config)
        fused = {name: t.to(device=device, dtype=dtype) for name, t in fused.items()}
        missing, unexpected = model.load_state_dict(fused, strict=False, assign=True)
        if "lm_head.weight" not in fused:  # tied: one matrix serves as embedding and LM head
            model.lm_head.weight = model.embed_tokens.weight
            missing.remove("lm_head.weight")
        if unexpected or missing:
            raise ValueError(f"checkpoint does not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
        model.rope_cos, model.rope_sin = (
            t.to(dtype) for t in rope_tables(config.head_dim, config.rope_theta, config.max_position_embeddings, device)
        )
        return model.eval().requires_grad_(False)


def fuse_projections(state_dict: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names -> this model's names: q/k/v and gate/up concatenated by rows.

    A tied LM head is left out: ``from_state_dict`` points it at the embedding matrix.
    """
    fused: dict[str, torch.Tensor] = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        fused[f"layers.{i}.self_attn.qkv_proj.weight"] = torch.cat(
            [state_dict[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]
        )
        fused[f"layers.{i}.self_attn.o_proj.weight"] = state_dict[p + "self_attn.o_proj.weight"]
        fused[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(
            [state_dict[p + "mlp.gate_proj.weight"], state_dict[p + "mlp.up_proj.weight"]]
        )
        fused[f"layers.{i}.mlp.down_proj.weight"] = state_dict[p + "mlp.down_proj.weight"]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            fused[f"layers.{i}.{norm}.weight"] = state_dict[p + f"{norm}.weight"]
    fused["embed_tokens.weight"] = state_dict["model.embed_tokens.weight"]
    fused["norm.weight"] = state_dict["model.norm.weight"]
    if config.tie_word_embeddings:
        return fused
    if "lm_head.weight" not in state_dict:
        raise ValueError("checkpoint has no lm_head.weight and does not tie it to the embeddings")
    fused["lm_head.weight"] = state_dict["lm_head.weight"]
    return fused
