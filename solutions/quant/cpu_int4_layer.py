"""An INT4 model's whole decoder layer as one compiled call, for a lone decode on a CPU.

Decoding one sequence with an INT4 model on a CPU, a layer's four matrix products take about as long as
everything around them: ~15 small torch operators (norms, RoPE, the KV store, attention's bookkeeping,
casts) and ten module calls of Python, a few microseconds each (``bench quant`` prints the step's split).
torch's INT4 product is an ordinary aten operator, so the whole layer can be exported: add + RMSNorm, the
Q/K/V product, RoPE + the KV store + one query's attention (``model/cpu_decode_layers.rope_store_attend``),
the output product, add + RMSNorm, gate/up, SiLU-mul, down. AOTInductor compiles it into one C++ function
(``kernels/cpu_aot.py``) and a decode step calls it once per layer: the products stay torch's kernel, and
what sat between them becomes a few fused loops with no Python in between. (A float model's products are
oneDNN's prepacked ones, which an exported function cannot take: its layers run as ``DecodeLayers``.)

The layer is the model's own math: ``llama.py``'s ``add_rms_norm``, ``apply_rope`` and ``silu_mul``, torch's
SDPA as the eager path calls it, and ``QuantLinear``'s product (``int4_mm_cpu``), exported with the model's
sizes fixed and only the context length free: one library per model shape, dtype and machine, compiled on
first use (seconds) into ``paths.kernel_cache_dir()`` and loaded in milliseconds after. It runs on the
one-token steps ``DecodeLayers`` runs (``CompiledDecode``: a lone decode, no hook; both context forms; a step
of several tokens of one sequence goes to a ``DecodeLayers`` loop over the same modules),
and is chosen the same way: where it agrees with the same function run eagerly and measures faster (cached
beside ``DecodeLayers``' decisions); ``FASTMODE_FUSED=0`` and the ``labs`` package keep the modules.

Invariant: the hidden states equal the modules' up to rounding; the compiled code rounds where eager rounds
(``emulate_precision_casts``). Built for ``model``'s weight tensors as they are at construction: a model
whose modules are replaced afterwards needs a new ``Int4DecodeLayers``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from ..kernels.cpu_aot import CompileFailed
from ..kernels.cpu_linear import machine_key
from ..model.cpu_decode_layers import (
    CompiledDecode,
    ContextRunners,
    DecodeLayers,
    choose,
    compile_both,
    context_inputs,
    dtypes_name,
    library_key,
    measure_compiled,
    rope_store,
    rope_store_attend,
    verify_attention,
)
from ..model.layer_ops import fused_ops_enabled
from ..model.llama import LlamaModel, add_rms_norm, apply_rope, rms_norm, silu_mul
from .linear import QuantLinear, int4_mm_cpu

log = logging.getLogger("fastmode")
MEASURE_CONTEXT = 256  # cache rows the measurement attends over


@dataclass(frozen=True)
class LayerShape:
    """The sizes a compiled layer is fixed at (with its dtypes, they name its library)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    group_size: int
    eps: float


def decode_layer(
    hidden: torch.Tensor,
    residual: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: torch.Tensor,
    qkv_scales: torch.Tensor,
    o: torch.Tensor,
    o_scales: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_scales: torch.Tensor,
    down: torch.Tensor,
    down_scales: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    row: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    shape: LayerShape,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer for one token (``DecoderLayer.forward`` with ``PLAIN_OPS``): ``(hidden, residual)``
    ``[1, hidden]`` in, the same pair one layer on out. ``keys``, ``values``, ``row``, ``rows``: the token's
    context in the cache and where its K/V go, as ``rope_store_attend`` takes them."""
    heads, kv_heads, group = shape.heads, shape.kv_heads, shape.group_size
    normed, residual = add_rms_norm(hidden, residual, input_norm, shape.eps)
    projected = int4_mm_cpu(normed, qkv, group, qkv_scales).view(1, heads + 2 * kv_heads, shape.head_dim)
    attended = rope_store_attend(projected, cos, sin, keys, values, row, rows, heads=heads, kv_heads=kv_heads)
    out = int4_mm_cpu(attended, o, group, o_scales)
    normed, residual = add_rms_norm(out, residual, post_norm, shape.eps)
    activated = silu_mul(int4_mm_cpu(normed, gate_up, group, gate_up_scales))
    return int4_mm_cpu(activated, down, group, down_scales), residual


SOURCES = (
    decode_layer,
    add_rms_norm,
    rms_norm,
    rope_store_attend,
    rope_store,
    apply_rope,
    silu_mul,
    int4_mm_cpu,
)


def layer_weights(layer: nn.Module) -> tuple[torch.Tensor, ...]:
    """The ten weight tensors ``decode_layer`` takes, in its order."""
    attention, mlp = layer.self_attn, layer.mlp
    return (
        layer.input_layernorm.weight,
        attention.qkv_proj.qweight,
        attention.qkv_proj.scale_offset,
        attention.o_proj.qweight,
        attention.o_proj.scale_offset,
        layer.post_attention_layernorm.weight,
        mlp.gate_up_proj.qweight,
        mlp.gate_up_proj.scale_offset,
        mlp.down_proj.qweight,
        mlp.down_proj.scale_offset,
    )


def layer_shape(model: LlamaModel) -> LayerShape | None:
    """The shape every layer of ``model`` shares, or None when a layer is not four CPU INT4 products of one
    group size around a dense MLP (a float or CUDA model, a MoE layer)."""
    config, group_sizes = model.config, set()
    for layer in model.layers:
        linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj)
        linears += (getattr(layer.mlp, "gate_up_proj", None), getattr(layer.mlp, "down_proj", None))
        if not all(isinstance(m, QuantLinear) and m.backend == "cpu" for m in linears):
            return None
        group_sizes |= {m.group_size for m in linears}
    if len(group_sizes) != 1:
        return None
    return LayerShape(
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
        group_sizes.pop(),
        config.rms_norm_eps,
    )


def example_inputs(
    weights: Sequence[torch.Tensor], shape: LayerShape, cache_dtype: torch.dtype, context: int, gathered: bool
) -> list[torch.Tensor]:
    """Seeded random inputs for ``decode_layer`` over ``weights`` and a context of ``context`` rows, read in
    place or ``gathered`` (``context_inputs``)."""
    generator, dtype = torch.Generator().manual_seed(0), weights[0].dtype
    hidden, residual = torch.randn(2, 1, shape.hidden, generator=generator).to(dtype)
    angles = torch.rand(1, shape.head_dim, generator=generator) * 6.3
    tail = context_inputs(shape.kv_heads, shape.head_dim, cache_dtype, context, gathered)
    return [hidden, residual, angles.cos().to(dtype), angles.sin().to(dtype), *weights, *tail]


def compiled_layer(
    weights: Sequence[torch.Tensor], shape: LayerShape, cache_dtype: torch.dtype
) -> tuple[ContextRunners, Path]:
    """``decode_layer`` compiled at ``shape`` for ``weights``' dtypes and a ``cache_dtype`` cache, both
    context forms (on first use; raises ``CompileFailed`` where it cannot be built)."""
    return compile_both(
        functools.partial(decode_layer, shape=shape),
        f"int4-decode-layer-{dtypes_name(weights[0].dtype, cache_dtype)}",
        SOURCES,
        {"machine": machine_key({}), "shape": asdict(shape)},
        lambda gathered: example_inputs(weights, shape, cache_dtype, 37, gathered),
    )


@torch.inference_mode()
def measure_layer(
    run: ContextRunners, weights: Sequence[torch.Tensor], shape: LayerShape, cache_dtype: torch.dtype
) -> dict[str, dict]:
    """``{"decode": {"path", "us"}}``: the compiled layer against ``decode_layer`` run eagerly, one token over
    ``MEASURE_CONTEXT`` cache rows read in place (eager without the model's module calls: a bound in its
    favour). A compiled layer that disagrees with the eager one in either form is never timed, nor chosen."""
    plain = functools.partial(decode_layer, shape=shape)
    inputs = functools.partial(example_inputs, weights, shape, cache_dtype, MEASURE_CONTEXT)
    return measure_compiled(run, plain, inputs)


class Int4DecodeLayers(CompiledDecode):
    """``model``'s layers for one decode token, one compiled call each: ``LlamaModel.fused_decode``."""

    def __init__(self, model: LlamaModel, run: ContextRunners, verify: DecodeLayers | None = None):
        super().__init__(model)
        self.run, self.verify = run, verify
        self.weights = [layer_weights(layer) for layer in model.layers]

    def __call__(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: object
    ) -> torch.Tensor | None:
        """The hidden state after every layer (``hidden + residual``), or None when this step is not one it
        runs (``CompiledDecode.context``): the caller then runs the modules."""
        if hidden.shape[0] > 1:  # a few tokens of one sequence: the layers as plain calls, if any
            return self.verify(hidden, cos, sin, attend) if self.verify is not None else None
        context = self.context(hidden, cos, sin, attend)
        if context is None:
            return None
        residual = torch.zeros_like(hidden)  # the first layer adds nothing to its input
        tail = [context.row] if context.rows is None else [context.row, context.rows]
        for weights, keys, values in zip(self.weights, context.keys, context.values, strict=True):
            hidden, residual = self.run([hidden, residual, cos, sin, *weights, keys, values, *tail])
        return hidden + residual


def int4_decode_layers(model: LlamaModel, cache_dtype: torch.dtype) -> Int4DecodeLayers | None:
    """The compiled decode layers for ``model`` (INT4 on a CPU, its KV cache in ``cache_dtype``) where they
    measure faster than the eager ones; None where they cannot run or do not pay (one log line says why when
    it is a failure to build), with ``FASTMODE_FUSED=0``, and under ``labs``."""
    if not fused_ops_enabled() or not __name__.startswith("solutions.") or not len(model.layers):
        return None
    shape = layer_shape(model)
    if shape is None or model.norm.weight.device.type != "cpu":
        return None
    weights = layer_weights(model.layers[0])
    try:
        run, path = compiled_layer(weights, shape, cache_dtype)
    except CompileFailed as error:
        log.warning("INT4 decode layer: AOTInductor could not build it (%s); running the modules", error)
        return None
    if not choose(library_key(path), functools.partial(measure_layer, run, weights, shape, cache_dtype)):
        return None
    config = model.config
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    verify = verify_attention(*heads, model.norm.weight.dtype, cache_dtype)
    return Int4DecodeLayers(model, run, DecodeLayers(model, None, verify))
