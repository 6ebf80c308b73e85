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
weights in four matrix-vector products. The residual stream is carried beside the normalised input
(``hidden, residual``), so each "add the block's output, then normalise" is one call (``add_rms_norm``).

The elementwise work between the products (norms, RoPE, SiLU-mul) goes through the model's ``LayerOps``:
``PLAIN_OPS`` are the functions of this file (Lab 0's), and an engine may swap in fused kernels that give
the same results up to rounding (``LlamaModel.use_ops``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attention import gqa_attention
from .config import ModelConfig, RopeScaling
from .moe import MoEMLP, moe_weight_sources, stacked_experts


class Attend(Protocol):
    """Writes this step's K/V for ``layer`` into the cache and attends: q ``[T, Hq, D]`` -> ``[T, Hq, D]``.

    An attend object may also offer ``rope_store_attend(layer, qkv, cos, sin, rope_store_kv)``: the same from
    the unrotated fused projection ``[T, Hq + 2 Hkv, D]``, RoPE and the store in one ``rope_store_kv``."""

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square normalisation over the last dimension, computed in float32.

    ``y = x / sqrt(mean(x**2) + eps) * weight``; the result has ``x``'s dtype.
    """
    raise NotImplementedError("Lab 0: y = x / RMS(x) * weight over the last dim; compute in float32, return x's dtype (hints: make hint LAB=0)")


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: RopeScaling | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """RoPE's ``head_dim / 2`` inverse frequencies ``theta ** (-2i / head_dim)``, rescaled as ``scaling``
    says.

    Computed in float32 with Hugging Face's own operations, so the tables match its to the last bit.
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    # dynamic NTK is the default up to max_position_embeddings
    if scaling is None or scaling.rope_type == "dynamic":
        return inv_freq
    # a GGUF's rope_freqs: llama.cpp divides each frequency by its factor
    if scaling.freq_factors is not None:
        factors = torch.tensor(scaling.freq_factors, dtype=torch.float32, device=device)
        if factors.shape != inv_freq.shape:
            raise ValueError(
                f"rope_freqs has {factors.numel()} factors, the model has {inv_freq.numel()} frequencies"
            )
        return inv_freq / factors
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between the two.
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    context = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    slowed = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    is_medium = ~(wavelen < context / high) * ~(wavelen > context / low)
    return torch.where(is_medium, blended, slowed)


def rope_tables(
    head_dim: int,
    theta: float,
    max_positions: int,
    device: torch.device | str | None = None,
    scaling: RopeScaling | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_positions, head_dim]`` for rotate-half RoPE.

    Frequency ``i`` (of ``head_dim / 2``) is ``theta ** (-2i / head_dim)`` (rescaled by ``scaling``:
    linear, llama3, or a GGUF's per-frequency factors); each is repeated for both halves of the head,
    matching Hugging Face's layout.
    """
    inv_freq = rope_inverse_frequencies(head_dim, theta, scaling, device)
    angles = torch.arange(max_positions, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each head of ``x`` ``[T, H, D]`` by its token's angles (``cos``, ``sin``: ``[T, D]``).

    Rotate-half convention: dimension ``j`` pairs with ``j + D/2``, so for each pair
    ``(a, b) -> (a cos - b sin, b cos + a sin)``.
    """
    raise NotImplementedError("Lab 0: rotate dimension pair (j, j + D/2) of every head by its token's angle (hints: make hint LAB=0)")


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add a block's output ``x`` to the residual stream, then normalise:
    ``(rms_norm(x + residual), x + residual)``.

    ``residual`` None (the first layer) adds nothing: the stream starts as ``x``."""
    residual = x if residual is None else x + residual
    return rms_norm(residual, weight, eps), residual


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the fused gate/up output ``[T, 2I]``: ``silu(gate) * up``, ``[T, I]``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class LayerOps:
    """The elementwise chains between a layer's matrix products, as one swappable set.

    ``add_rms_norm(x, residual, weight, eps) -> (normed, new_residual)`` (``residual`` may be None);
    ``rope(qk [T, H, D], cos [T, D], sin [T, D]) -> rotated`` (may write ``qk`` in place);
    ``silu_mul(gate_up [T, 2I]) -> [T, I]``. Every set must agree with ``PLAIN_OPS`` up to rounding.
    ``rope_store_kv`` (optional): RoPE fused with the KV store, ``(qkv, cos, sin, k_cache, v_cache,
    slot_mapping) -> rotated q`` (``kernels/fused_ops.py``), used if ``attend`` offers ``rope_store_attend``.
    """

    name: str
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rope: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    rope_store_kv: Callable[..., torch.Tensor] | None = None


PLAIN_OPS = LayerOps("plain", add_rms_norm, apply_rope, silu_mul)
"""This file's functions, one torch operator at a time: what the lab teaches, and the reference."""


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class AddRMSNorm(RMSNorm):
    """A decoder layer's norm: ``(x, residual) -> (rms_norm(x + residual), x + residual)`` through ``ops``."""

    def __init__(self, size: int, eps: float):
        super().__init__(size, eps)
        self.ops = PLAIN_OPS

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_heads,
            config.num_kv_heads,
            config.head_dim,
        )
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)
        self.ops = PLAIN_OPS

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        tokens, rotated_heads = x.shape[0], self.num_heads + self.num_kv_heads
        qkv = self.qkv_proj(x).view(tokens, rotated_heads + self.num_kv_heads, self.head_dim)
        rope_store_attend = getattr(attend, "rope_store_attend", None) if self.ops.rope_store_kv else None
        if rope_store_attend is not None:  # one kernel rotates Q and K and writes K and V into the cache
            out = rope_store_attend(self.layer, qkv, cos, sin, self.ops.rope_store_kv)
            return self.o_proj(out.reshape(tokens, -1))
        # Q and K heads sit side by side in the fused projection: rotate them in one call.
        q, k = self.ops.rope(qkv[:, :rotated_heads], cos, sin).split(
            [self.num_heads, self.num_kv_heads], dim=1
        )
        out = attend(self.layer, q, k, qkv[:, rotated_heads:])
        return self.o_proj(out.reshape(tokens, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.ops = PLAIN_OPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.silu_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer)
        self.post_attention_layernorm = AddRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoEMLP(config) if config.num_local_experts else MLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hidden, residual)`` -> the same pair one layer on: the residual stream is ``hidden + residual``
        (``residual`` None: the stream is ``hidden``)."""
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, attend)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


def use_layer_ops(module: nn.Module, ops: LayerOps) -> None:
    """Run the elementwise chains of every decoder layer inside ``module`` through ``ops``."""
    for child in module.modules():
        if isinstance(child, AddRMSNorm | Attention | MLP):
            child.ops = ops


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
        # Optional: the layers for a one-token step, or a few tokens of one sequence, without module calls
        # (``model/cpu_decode_layers.py``), given (hidden, cos, sin, attend); it returns None for a step it
        # cannot run, and the layers run here.
        self.fused_decode: Callable[..., torch.Tensor | None] | None = None

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        """``input_ids``, ``positions``: ``[T]``.
        Returns hidden states ``[T, hidden]`` (before the final norm)."""
        if self.rope_cos is None:
            raise RuntimeError(
                "the model has no weights yet: build it with LlamaModel.from_state_dict "
                "(or loader.load_weights)"
            )
        cos, sin = self.rope_cos[positions], self.rope_sin[positions]
        hidden, residual = self.embed_tokens(input_ids), None
        if self.fused_decode is not None:
            out = self.fused_decode(hidden, cos, sin, attend)
            if out is not None:
                return out
        for layer in self.layers:
            hidden, residual = layer(hidden, residual, cos, sin, attend)
        return hidden + residual

    @property
    def ops(self) -> LayerOps:
        """The ``LayerOps`` every layer runs (``PLAIN_OPS`` until ``use_ops``)."""
        return self.layers[0].self_attn.ops if len(self.layers) else PLAIN_OPS

    def use_ops(self, ops: LayerOps) -> None:
        """Run every layer's elementwise chains through ``ops`` (fused kernels, say)
        instead of the current set."""
        use_layer_ops(self, ops)

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
        cls,
        config: ModelConfig,
        state_dict: Mapping[str, torch.Tensor],
        device: str | torch.device,
        dtype: torch.dtype,
    ) -> LlamaModel:
        """Build on the meta device, then fill each weight from Hugging Face Llama
        names (fusing Q/K/V, gate/up).

        Streams: each source tensor is looked up once and copied straight into its final dtype and
        device, so with a lazy ``state_dict`` (the loader's) peak memory is the final weights plus one
        source tensor. A tensor the model has no place for is an error naming it, never dropped.
        """
        if config.num_local_experts:  # per-expert Mixtral tensors, seen as one stacked tensor per layer
            state_dict = stacked_experts(state_dict, config.num_layers, config.num_local_experts)
        sources = fused_weight_sources(config)
        _check_names(state_dict, sources, config)
        with torch.device("meta"):
            model = cls(config)
        shapes = {name: param.shape for name, param in model.named_parameters()}
        weights = {
            name: _gather(state_dict, names, shapes[name], device, dtype) for name, names in sources.items()
        }
        model.load_state_dict(weights, strict=False, assign=True)
        if config.tie_word_embeddings:  # one matrix serves as embedding and LM head
            model.lm_head.weight = model.embed_tokens.weight
        model.rope_cos, model.rope_sin = (
            t.to(dtype)
            for t in rope_tables(
                config.head_dim,
                config.rope_theta,
                config.max_position_embeddings,
                device,
                config.rope_scaling,
            )
        )
        return model.eval().requires_grad_(False)


def fused_weight_sources(config: ModelConfig) -> dict[str, list[str]]:
    """This model's parameter names -> the Hugging Face Llama tensors stacked by rows into each.

    Q/K/V and gate/up are fused; every other weight has one source. A tied LM head is left out:
    ``from_state_dict`` points it at the embedding matrix.
    """
    sources: dict[str, list[str]] = {}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        sources[f"layers.{i}.self_attn.qkv_proj.weight"] = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
        sources[f"layers.{i}.self_attn.o_proj.weight"] = [p + "self_attn.o_proj.weight"]
        if config.num_local_experts:
            sources.update(moe_weight_sources(i))
        else:
            sources[f"layers.{i}.mlp.gate_up_proj.weight"] = [
                p + "mlp.gate_proj.weight",
                p + "mlp.up_proj.weight",
            ]
            sources[f"layers.{i}.mlp.down_proj.weight"] = [p + "mlp.down_proj.weight"]
        for norm in ("input_layernorm", "post_attention_layernorm"):
            sources[f"layers.{i}.{norm}.weight"] = [p + f"{norm}.weight"]
    sources["embed_tokens.weight"] = ["model.embed_tokens.weight"]
    sources["norm.weight"] = ["model.norm.weight"]
    if not config.tie_word_embeddings:
        sources["lm_head.weight"] = ["lm_head.weight"]
    return sources


def _check_names(
    state_dict: Mapping[str, torch.Tensor], sources: dict[str, list[str]], config: ModelConfig
) -> None:
    """Every source present; nothing else but what is knowingly unused (a tied checkpoint's copy of the
    head, old checkpoints' rotary buffers, which are recomputed from the config)."""
    needed = {name for names in sources.values() for name in names}
    missing = [name for name in needed if name not in state_dict]
    if "lm_head.weight" in missing:
        raise ValueError("checkpoint has no lm_head.weight and does not tie it to the embeddings")
    ignorable = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unexpected = [
        name
        for name in state_dict
        if name not in needed and name not in ignorable and not name.endswith("rotary_emb.inv_freq")
    ]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not fit a {config.num_layers}-layer Llama: missing {sorted(missing)[:4]}, "
            f"tensors it does not understand {sorted(unexpected)[:8]}"
        )


def _gather(
    state_dict: Mapping[str, torch.Tensor],
    names: list[str],
    shape: torch.Size,
    device: str | torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Stack ``names`` by rows into one new ``shape`` tensor on ``device`` in
    ``dtype``, one source at a time."""
    if len(names) == 1:
        tensor = state_dict[names[0]]
        if tensor.shape != shape:
            raise ValueError(f"{names[0]} has shape {tuple(tensor.shape)}, the model expects {tuple(shape)}")
        return tensor.to(device=device, dtype=dtype)
    out = torch.empty(shape, device=device, dtype=dtype)
    row = 0
    for name in names:
        tensor = state_dict[name]
        if tensor.shape[1:] != shape[1:] or row + tensor.shape[0] > shape[0]:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, which does not fit rows of {tuple(shape)}"
            )
        out[row : row + tensor.shape[0]].copy_(tensor)
        row += tensor.shape[0]
    if row != shape[0]:
        raise ValueError(f"{', '.join(names)} fill {row} rows, the model expects {shape[0]}")
    return out
