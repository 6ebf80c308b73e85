"""A lone decode's layers on a CPU without the module calls: the step that batch-1 decoding runs hundreds of
times a second.

Decoding one sequence on a CPU, the model's layers cost more than their matrix products: each layer is ten
module calls (the decoder layer, its attention and MLP, two norms, four linears), each a few microseconds
of Python before any work, and between the Q/K/V and output products sit RoPE, the K/V store, the cast to
the cache's dtype and torch's attention call, five operators of a few microseconds each for one query.
``bench decode`` prints the step's split. ``DecodeLayers`` runs the same layers for a one-token step as one
Python loop over plain function calls:

    for each layer:
        normed, residual = ops.add_rms_norm(hidden, residual, input_norm)    (the model's LayerOps)
        qkv = qkv_proj.forward(normed)                                      (the product cpu_linear chose)
        attended = attention([qkv, cos, sin, keys, values, row])            (one compiled call, below)
        hidden = o_proj.forward(attended)
        normed, residual = ops.add_rms_norm(hidden, residual, post_norm)
        hidden = down_proj.forward(ops.silu_mul(gate_up_proj.forward(normed)))

``rope_store_attend`` is RoPE on the token's Q and K heads, its K/V written at its row of the cache, and its
query's attention over the whole context (torch's fused SDPA, as the eager path calls it), exported and
compiled ahead of time (``kernels/cpu_aot.py``) with the model's head counts fixed and the context length
free: one library per head shape, dtype and machine, seconds to build on first use, milliseconds to load.
The context comes as ``PagedAttention.decode_context`` gives it: one run of cache rows read in place (a
fresh sequence's blocks), or its rows gathered (blocks shared through the prefix cache, or handed out again
in another order), so it is compiled in both forms (``ContextRunners``). An INT4 model goes further: its
whole layer is one compiled call (``quant/cpu_int4_layer.py``).

A verify pass (a chain's or a tree's root and drafts: one sequence's 2 to ``MAX_VERIFY_ROWS`` new tokens, or
a short prompt chunk) runs the same loop over its rows, its attention ``rope_store_attend_rows``: each new
token over the context gathered and the mask the step gives (``verify_context`` of ``PagedAttention``: token
``i`` sees its predecessors; of ``TreeAttention``: a node sees the context and its own path), compiled with
the rows free where it agrees with its eager form and measures faster, else run eagerly. Without this a
verify pass ran the modules, and paid about a third of a plain step for it on top of its extra rows (``bench
decode --rows``: the step from one row to two).

When it runs (``__call__`` returns None otherwise, and the model runs its modules): a step of one token, a
lone decode on the torch path (``decode_context``), or of one sequence's few new tokens (``verify_context``);
hidden states and rotary tables of the dtype it was built for, and no forward hook on any module it stands in
for (a hook must see its module run). The compiled attention is chosen as the fused chains are
(``model/cpu_layer_ops.py``): only where it agrees with the eager one (in both forms) and measures faster,
cached in ``cache_dir()/cpu_decode_layers.json``; ``FASTMODE_FUSED=0`` and the ``labs`` package keep the
modules.

Invariant: the hidden states equal the modules' up to rounding (the compiled RoPE and casts round where
eager rounds; attention is the same SDPA kernel). Built for ``model``'s modules as they are at construction:
a model whose modules are replaced afterwards needs a new one (linears' forwards and the ``LayerOps`` are
looked up at every call, so timers wrapped around them see their calls).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from ..kernels.cpu_aot import CompileFailed, Runner, compile_function, package_path
from ..kernels.cpu_linear import cached_decisions, fastest_rounds, machine_key
from ..paths import cache_dir, kernel_cache_dir
from .layer_ops import fused_ops_enabled
from .llama import LlamaModel, apply_rope
from .moe import MoEMLP

log = logging.getLogger("fastmode")
CACHE_FILE = "cpu_decode_layers.json"
PATHS = ("plain", "compiled")
REGIMES = {"decode": 1}  # the regime a decision is filed under (one-token and verify attention alike)
MEASURE_CONTEXT = 256  # cache rows a measurement attends over
MAX_VERIFY_ROWS = 16  # new tokens of one sequence a step may verify through the layers below
MEASURE_ROWS = 4  # new tokens the verify attention is measured with (a chain of 3 drafts)
CALLS_PER_ROUND = 16


def rope_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    row: torch.Tensor,
    *,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """RoPE on the new tokens' Q and K heads (``qkv`` ``[R, heads + 2 kv_heads, D]``), their K and V written
    at ``row`` (``[R]``) of ``keys``, ``values`` (in place, in the cache's dtype); returns the rotated
    queries ``[R, heads, D]``."""
    q, k = apply_rope(qkv[:, : heads + kv_heads], cos, sin).split([heads, kv_heads], dim=1)
    keys.index_copy_(0, row, k.to(keys.dtype))
    values.index_copy_(0, row, qkv[:, heads + kv_heads :].to(values.dtype))
    return q


def rope_store_attend(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    row: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """One token's attention from its fused projection ``qkv`` ``[1, heads + 2 kv_heads, D]``: RoPE on its Q
    and K heads (``cos``, ``sin`` ``[1, D]``), its K and V written at ``row`` (``[1]`` int64) of ``keys``,
    ``values`` ``[S, kv_heads, D]`` (the cache, written in place), then its query over its context: all of
    ``keys`` and ``values`` (one run of cache rows, read in place), or given ``rows`` (``[L]`` int64, in token
    order), those rows gathered. Returns ``[1, heads * D]`` in ``qkv``'s dtype; attention runs in the cache's
    dtype."""
    q = rope_store(qkv, cos, sin, keys, values, row, heads=heads, kv_heads=kv_heads)
    if rows is not None:
        keys, values = keys.index_select(0, rows), values.index_select(0, rows)
    heads_first = [t.transpose(0, 1)[None] for t in (q.to(keys.dtype), keys, values)]  # [1, H, L|1, D]
    attended = F.scaled_dot_product_attention(*heads_first, enable_gqa=True)
    return attended.reshape(1, -1).to(qkv.dtype)


def rope_store_attend_rows(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    row: torch.Tensor,
    rows: torch.Tensor,
    visible: torch.Tensor,
    *,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """``rope_store_attend`` for R new tokens of one sequence (a verify pass over a chain or a tree of
    drafts): ``qkv`` ``[R, heads + 2 kv_heads, D]``, ``cos``, ``sin`` ``[R, D]``, their K and V written at
    ``row`` (``[R]``), then each query over the context ``rows`` (``[L]``, the R tokens last) where
    ``visible`` (``[R, L]`` bool) lets it see: for a chain, query ``i`` sees the first ``L - R + 1 + i`` rows;
    for a tree, the context and the node's own path. Returns ``[R, heads * D]``."""
    q = rope_store(qkv, cos, sin, keys, values, row, heads=heads, kv_heads=kv_heads)
    keys, values = keys.index_select(0, rows), values.index_select(0, rows)
    new = qkv.shape[0]
    heads_first = [t.transpose(0, 1)[None] for t in (q.to(keys.dtype), keys, values)]  # [1, H, R|L, D]
    attended = F.scaled_dot_product_attention(*heads_first, attn_mask=visible, enable_gqa=True)
    return attended[0].transpose(0, 1).reshape(new, -1).to(qkv.dtype)


def library_key(path: Path) -> str:
    """A decision's key: the library's file name, which hashes its source, shapes, dtypes and machine (a
    changed function is measured anew)."""
    return path.stem


def choose(key: str, measure: Callable[[], dict[str, dict]]) -> bool:
    """Whether the compiled path won ``measure`` (``{"decode": {"path", "us"}}``), from the cache where it
    holds ``key``, else measured now and cached."""
    machine = machine_key({"paths": list(PATHS), "regimes": REGIMES})
    decisions = cached_decisions({key: measure}, True, cache_dir() / CACHE_FILE, machine, PATHS, REGIMES)
    return decisions[key]["decode"]["path"] == "compiled"


def measure_compiled(
    run: ContextRunners, plain: Callable, inputs: Callable[[bool], list[torch.Tensor]]
) -> dict[str, dict]:
    """``{"decode": {"path", "us"}}``: ``run`` against ``plain`` (the same function run eagerly) on the
    in-place form of ``inputs(gathered)``; a ``run`` disagreeing in either form is never timed or chosen."""
    timed = inputs(False)
    calls = {"plain": functools.partial(plain, *timed)}
    if agree_in_both_forms(run, plain, inputs):
        calls["compiled"] = functools.partial(run, timed)
    best = fastest_rounds({name: [call] * CALLS_PER_ROUND for name, call in calls.items()})
    us = {name: round(seconds * 1e6, 2) for name, seconds in best.items()}
    return {"decode": {"path": min(us, key=us.get), "us": us}}


def agrees(got: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> bool:
    """Equal up to rounding: relative error of each pair's norm within bfloat16's (float32 is far inside)."""
    return all(
        float((a.double() - b.double()).norm()) <= 2e-2 * float(b.double().norm())
        for a, b in zip(got, expected, strict=True)
    )


def context_inputs(
    kv_heads: int, head_dim: int, cache_dtype: torch.dtype, context: int, gathered: bool
) -> list[torch.Tensor]:
    """Seeded random trailing inputs of a compiled function over a decode's context (``DecodeContext``'s
    fields): ``context`` rows read in place, the token's last; or, ``gathered``, a cache of
    ``2 * context + 3`` rows and ``context`` of them in a shuffled order, the token's last."""
    generator = torch.Generator().manual_seed(1)
    slots = 2 * context + 3 if gathered else context
    keys, values = torch.randn(2, slots, kv_heads, head_dim, generator=generator).to(cache_dtype)
    if not gathered:
        return [keys, values, torch.tensor([context - 1])]
    rows = torch.randperm(slots, generator=generator)[:context]
    return [keys, values, rows[-1:].clone(), rows]


def context_dynamic(gathered: bool) -> list[dict | None]:
    """The dynamic dimensions of ``context_inputs``: the cache rows and the context's length."""
    if not gathered:
        context = Dim("context", min=2)
        return [{0: context}, {0: context}, None]
    slots, context = Dim("slots", min=2), Dim("context", min=2)
    return [{0: slots}, {0: slots}, None, {0: context}]


def attention_inputs(
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    context: int,
    gathered: bool = False,
) -> list[torch.Tensor]:
    """Seeded random inputs for ``rope_store_attend`` over ``context`` rows (``context_inputs``)."""
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, heads + 2 * kv_heads, head_dim, generator=generator).to(dtype)
    angles = torch.rand(1, head_dim, generator=generator) * 6.3
    tail = context_inputs(kv_heads, head_dim, cache_dtype, context, gathered)
    return [qkv, angles.cos().to(dtype), angles.sin().to(dtype), *tail]


class ContextRunners:
    """A function compiled for both forms of a ``DecodeContext``: called with the in-place form's ``arity``
    inputs it runs that library, with one more (the context's ``rows``) the gathering one."""

    def __init__(self, in_place: Runner, gathered: Runner, arity: int):
        self.in_place, self.gathered, self.arity = in_place, gathered, arity

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return (self.in_place if len(inputs) == self.arity else self.gathered)(inputs)


def compile_both(
    fn: Callable, name: str, sources: Sequence[Callable], key: object, examples: Callable[[bool], list]
) -> tuple[ContextRunners, Path]:
    """``fn`` compiled for both context forms (``examples(gathered)`` gives each form's example inputs, their
    trailing ``context_inputs`` dynamic): the runners, and the in-place library's path (a decision's key)."""
    runners, paths = [], []
    for gathered in (False, True):
        inputs = examples(gathered)
        dynamic = [None] * (len(inputs) - (4 if gathered else 3)) + context_dynamic(gathered)
        form = "gathered" if gathered else "in-place"
        path = package_path(kernel_cache_dir(), f"{name}-{form}", sources, inputs, dynamic, key)
        if not path.exists():
            log.info("compiling %s (once per machine and model shape: seconds)", path.name)
        runners.append(compile_function(fn, inputs, dynamic, path))
        paths.append(path)
    return ContextRunners(*runners, arity=len(examples(False))), paths[0]


def compiled_attention(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype
) -> tuple[ContextRunners, Path]:
    """``rope_store_attend`` compiled for these head counts, ``dtype`` projections and a ``cache_dtype``
    cache, both context forms (on first use; raises ``CompileFailed`` where it cannot be built)."""
    fn = functools.partial(rope_store_attend, heads=heads, kv_heads=kv_heads)
    return compile_both(
        fn,
        f"rope-store-attend-{dtypes_name(dtype, cache_dtype)}",
        (rope_store_attend, rope_store, apply_rope),
        {"machine": machine_key({}), "heads": [heads, kv_heads, head_dim]},
        lambda gathered: attention_inputs(heads, kv_heads, head_dim, dtype, cache_dtype, 37, gathered),
    )


def rows_attention_inputs(
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
    new: int,
    context: int,
) -> list[torch.Tensor]:
    """Seeded random inputs for ``rope_store_attend_rows``: ``new`` tokens after ``context - new`` others, in
    a cache of ``2 * context + 3`` rows, the context's rows shuffled, a random mask that lets each token see
    the context and itself."""
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(new, heads + 2 * kv_heads, head_dim, generator=generator).to(dtype)
    angles = torch.rand(new, head_dim, generator=generator) * 6.3
    keys, values = torch.randn(2, 2 * context + 3, kv_heads, head_dim, generator=generator).to(cache_dtype)
    rows = torch.randperm(2 * context + 3, generator=generator)[:context]
    among_new = (torch.rand(new, new, generator=generator) < 0.5) | torch.eye(new, dtype=torch.bool)
    visible = torch.cat([torch.ones(new, context - new, dtype=torch.bool), among_new], dim=1)
    return [
        qkv,
        angles.cos().to(dtype),
        angles.sin().to(dtype),
        keys,
        values,
        rows[-new:].clone(),
        rows,
        visible,
    ]


def compiled_rows_attention(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype
) -> tuple[Runner, Path]:
    """``rope_store_attend_rows`` compiled for these head counts and dtypes, the new rows (2 to
    ``MAX_VERIFY_ROWS``), the cache and the context free: the runner and its library's path."""
    fn = functools.partial(rope_store_attend_rows, heads=heads, kv_heads=kv_heads)
    new, slots, context = Dim("new", min=2, max=MAX_VERIFY_ROWS), Dim("slots", min=2), Dim("context", min=2)
    dynamic = [
        {0: new},
        {0: new},
        {0: new},
        {0: slots},
        {0: slots},
        {0: new},
        {0: context},
        {0: new, 1: context},
    ]
    inputs = rows_attention_inputs(heads, kv_heads, head_dim, dtype, cache_dtype, 3, 37)
    key = {"machine": machine_key({}), "heads": [heads, kv_heads, head_dim]}
    name = f"rope-store-attend-rows-{dtypes_name(dtype, cache_dtype)}"
    path = package_path(
        kernel_cache_dir(), name, (rope_store_attend_rows, rope_store, apply_rope), inputs, dynamic, key
    )
    if not path.exists():
        log.info("compiling %s (once per machine and model shape: seconds)", path.name)
    return compile_function(fn, inputs, dynamic, path), path


@torch.inference_mode()
def measure_rows_attention(
    run: Runner, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype
) -> dict[str, dict]:
    """``{"decode": {"path", "us"}}``: the compiled ``rope_store_attend_rows`` against the same function run
    eagerly, ``MEASURE_ROWS`` new tokens over ``MEASURE_CONTEXT`` rows; a compiled one that disagrees with it
    is not timed."""
    plain = functools.partial(rope_store_attend_rows, heads=heads, kv_heads=kv_heads)
    sizes = (heads, kv_heads, head_dim, dtype, cache_dtype, MEASURE_ROWS, MEASURE_CONTEXT)
    inputs = functools.partial(rows_attention_inputs, *sizes)
    expected_inputs, fresh = inputs(), inputs()
    timed = inputs()
    calls = {"plain": functools.partial(plain, *timed)}
    if agrees(run(fresh), [plain(*expected_inputs)]) and agrees(fresh[3:5], expected_inputs[3:5]):
        calls["compiled"] = functools.partial(run, timed)
    best = fastest_rounds({name: [call] * CALLS_PER_ROUND for name, call in calls.items()})
    us = {name: round(seconds * 1e6, 2) for name, seconds in best.items()}
    return {"decode": {"path": min(us, key=us.get), "us": us}}


def verify_attention(
    heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, cache_dtype: torch.dtype
) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """What ``DecodeLayers`` calls for a step of several new tokens: the compiled ``rope_store_attend_rows``
    where it builds, agrees and measures faster, else the same function run eagerly (still without the
    modules' calls)."""
    plain = functools.partial(rope_store_attend_rows, heads=heads, kv_heads=kv_heads)
    eager = lambda inputs: [plain(*inputs)]  # noqa: E731
    try:
        run, path = compiled_rows_attention(heads, kv_heads, head_dim, dtype, cache_dtype)
    except CompileFailed as error:
        log.warning("decode layers: AOTInductor could not build the verify attention (%s); eager", error)
        return eager
    measure = functools.partial(measure_rows_attention, run, heads, kv_heads, head_dim, dtype, cache_dtype)
    return run if choose(library_key(path), measure) else eager


def agree_in_both_forms(run: ContextRunners, plain: Callable, inputs: Callable[[bool], list]) -> bool:
    """Whether ``run`` agrees with ``plain`` (the function run eagerly) in both forms, outputs and the cache
    rows it wrote alike."""
    for gathered in (False, True):
        expected_inputs, fresh = inputs(gathered), inputs(gathered)
        expected = plain(*expected_inputs)
        expected = list(expected) if isinstance(expected, tuple) else [expected]
        cache = slice(-4, -2) if gathered else slice(-3, -1)
        if not (agrees(run(fresh), expected) and agrees(fresh[cache], expected_inputs[cache])):
            return False
    return True


def dtypes_name(dtype: torch.dtype, cache_dtype: torch.dtype) -> str:
    """The two dtypes as a library's name holds them: ``bfloat16-float32``."""
    return f"{str(dtype).removeprefix('torch.')}-{str(cache_dtype).removeprefix('torch.')}"


class CompiledDecode:
    """What a one-token step needs before compiled layers may run it instead of the model's modules."""

    def __init__(self, model: LlamaModel):
        self.model, self.dtype = model, model.norm.weight.dtype
        # the hook dictionaries of every module stood in for (registering a hook adds to them in place)
        self.hooks = [
            hooks
            for layer in model.layers
            for module in layer.modules()
            for hooks in (module._forward_hooks, module._forward_pre_hooks)
        ]

    def context(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: object) -> object:
        """``attend``'s ``DecodeContext`` when this one-token step can run compiled, else None."""
        if hidden.shape[0] != 1 or not hidden.dtype == cos.dtype == sin.dtype == self.dtype or self.hooked():
            return None
        decode_context = getattr(attend, "decode_context", None)
        return decode_context() if decode_context is not None else None

    def rows_context(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: object
    ) -> object:
        """``attend``'s ``DecodeContext`` (gathered form) when this step is one sequence's 2 to
        ``MAX_VERIFY_ROWS`` new tokens and can run here, else None."""
        if not 2 <= hidden.shape[0] <= MAX_VERIFY_ROWS:
            return None
        if not hidden.dtype == cos.dtype == sin.dtype == self.dtype or self.hooked():
            return None
        verify_context = getattr(attend, "verify_context", None)
        return verify_context(MAX_VERIFY_ROWS) if verify_context is not None else None

    def hooked(self) -> bool:
        """Whether a forward hook would miss its call (on a module stood in for, or on every module)."""
        if nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
            return True
        return any(self.hooks)


class DecodeLayers(CompiledDecode):
    """``model``'s layers for one decode token as plain calls, attention compiled: a ``fused_decode``."""

    def __init__(
        self,
        model: LlamaModel,
        attention: ContextRunners | None,
        verify: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None,
    ):
        """``attention`` serves one-token steps (None: this serves only steps of several tokens, as an INT4
        model's, whose one-token layer is compiled whole), ``verify`` steps of several (None: it declines)."""
        super().__init__(model)
        self.attention, self.verify = attention, verify
        config = model.config
        self.eps, self.heads = config.rms_norm_eps, config.num_heads + 2 * config.num_kv_heads
        # per layer, looked up once (a submodule lookup goes through nn.Module.__getattr__): the norms'
        # weights and the four linears, whose ``forward`` is read at each call (a timer may wrap it)
        self.parts = [
            (
                layer.input_layernorm.weight,
                layer.self_attn.qkv_proj,
                layer.self_attn.o_proj,
                layer.post_attention_layernorm.weight,
                layer.mlp.gate_up_proj,
                layer.mlp.down_proj,
            )
            for layer in model.layers
        ]

    def __call__(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: object
    ) -> torch.Tensor | None:
        """The hidden state after every layer (``hidden + residual``), or None when this step is not one it
        runs (see the module's docstring): the caller then runs the modules."""
        attention = self.attention
        context = self.context(hidden, cos, sin, attend) if attention is not None else None
        if context is None and self.verify is not None:
            context, attention = self.rows_context(hidden, cos, sin, attend), self.verify
        if context is None:
            return None
        context_tail = [context.row] if context.rows is None else [context.row, context.rows]
        if context.visible is not None:
            context_tail.append(context.visible)
        ops, eps, residual, shape = self.model.ops, self.eps, None, (hidden.shape[0], self.heads, -1)
        for parts, keys, values in zip(self.parts, context.keys, context.values, strict=True):
            input_norm, qkv_proj, o_proj, post_norm, gate_up_proj, down_proj = parts
            normed, residual = ops.add_rms_norm(hidden, residual, input_norm, eps)
            qkv = qkv_proj.forward(normed).view(shape)
            attended = attention([qkv, cos, sin, keys, values, *context_tail])[0]
            hidden = o_proj.forward(attended)
            normed, residual = ops.add_rms_norm(hidden, residual, post_norm, eps)
            hidden = down_proj.forward(ops.silu_mul(gate_up_proj.forward(normed)))
        return hidden + residual


@torch.inference_mode()
def measure_attention(
    run: ContextRunners,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    cache_dtype: torch.dtype,
) -> dict[str, dict]:
    """The compiled ``rope_store_attend`` against the same function run eagerly (its operators one by one,
    as the modules run them), in place over ``MEASURE_CONTEXT`` rows; a compiled one that disagrees in
    either form is not timed."""
    plain = functools.partial(rope_store_attend, heads=heads, kv_heads=kv_heads)
    sizes = (heads, kv_heads, head_dim, dtype, cache_dtype, MEASURE_CONTEXT)
    inputs = functools.partial(attention_inputs, *sizes)
    return measure_compiled(run, plain, inputs)


def decode_layers(model: LlamaModel, cache_dtype: torch.dtype) -> DecodeLayers | None:
    """``DecodeLayers`` for ``model`` on a CPU (its KV cache in ``cache_dtype``) where the compiled attention
    measures faster than the eager one; None where it cannot run (a MoE layer, a build failure: one log line
    says so), with ``FASTMODE_FUSED=0``, and under ``labs``."""
    if not fused_ops_enabled() or not __name__.startswith("solutions.") or not len(model.layers):
        return None
    if model.norm.weight.device.type != "cpu" or any(isinstance(layer.mlp, MoEMLP) for layer in model.layers):
        return None
    config, dtype = model.config, model.norm.weight.dtype
    heads = (config.num_heads, config.num_kv_heads, config.head_dim)
    try:
        run, path = compiled_attention(*heads, dtype, cache_dtype)
    except CompileFailed as error:
        log.warning("decode layers: AOTInductor could not build their attention (%s); running modules", error)
        return None
    if not choose(library_key(path), functools.partial(measure_attention, run, *heads, dtype, cache_dtype)):
        return None
    return DecodeLayers(model, run, verify_attention(*heads, dtype, cache_dtype))
