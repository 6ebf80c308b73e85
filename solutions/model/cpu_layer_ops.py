"""The ``LayerOps`` a CPU model runs: each elementwise chain between the matrix products (add + RMSNorm, RoPE,
SiLU-mul) either as ``PLAIN_OPS`` runs it, one torch operator at a time, or fused into one C++ loop compiled
ahead of time (``kernels/cpu_aot.py``), whichever measures faster on this machine at the model's own shapes.

The fused chains are the very functions of ``llama.py`` (``add_rms_norm``, ``apply_rope``, ``silu_mul``),
exported with every size dynamic: one library per chain and dtype serves every model and token count,
compiled on a machine's first use (minutes) and loaded in milliseconds after (``paths.kernel_cache_dir()``).
Each is wrapped so that an input it was not compiled for (another dtype or device, a strided layout, a tensor
that needs gradients, the first layer's missing residual) runs the plain function instead: the fused set never
fails where the plain one works.

Which set wins is measured as ``cpu_linear`` measures the linears, and cached with its helpers: per chain and
regime (1 row, 8 rows, 128 rows), alternating rounds, the fastest round of each; a fused chain whose output
differs from the plain one beyond rounding is never chosen. The decisions live in
``cache_dir()/cpu_layer_ops.json``, keyed by the machine. ``FASTMODE_FUSED=0`` keeps ``PLAIN_OPS``
(``layer_ops.select_layer_ops`` reads it), and so does the ``labs`` package: there the chains are a learner's
own functions, graded as written (compiling them would also take minutes after every edit).

Invariant: the returned set agrees with ``PLAIN_OPS`` up to rounding. In float32 RoPE gives the same bits;
add + RMSNorm differs by the order of the mean's sum, SiLU by the exponential's last bit. In bfloat16 every
intermediate is rounded to bfloat16 where eager rounds it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.export import Dim

from ..kernels.cpu_aot import CompileFailed, Runner, compile_function, package_path, require_compiler
from ..kernels.cpu_linear import cached_decisions, fastest_rounds, machine_key
from ..paths import cache_dir, kernel_cache_dir, shown
from .llama import PLAIN_OPS, LayerOps, add_rms_norm, apply_rope, rms_norm, silu_mul

log = logging.getLogger("fastmode")
CACHE_FILE = "cpu_layer_ops.json"
PATHS = ("plain", "compiled")
REGIMES = {"decode": 1, "batch": 8, "prefill": 128}  # rows per call each regime is timed at
PREFILL_ROWS = 64  # a call with this many rows or more uses the prefill choice; 2..63 the batch choice
CALLS_PER_ROUND = 32  # calls timed back to back per round: a one-row chain takes microseconds


@dataclass(frozen=True)
class Chain:
    """One elementwise chain: the plain function, the functions whose code it runs (their source names the
    compiled library), inputs of ``rows`` rows at given sizes, and which of their dimensions vary."""

    plain: Callable
    sources: tuple[Callable, ...]
    inputs: Callable[[int, dict[str, int], torch.dtype, torch.Generator], tuple[torch.Tensor, ...]]
    dynamic_shapes: Callable[[], tuple[dict | None, ...]]


def _norm_inputs(rows, sizes, dtype, generator) -> tuple[torch.Tensor, ...]:
    x, residual = torch.randn(2, rows, sizes["hidden"], generator=generator).to(dtype)
    weight = 1 + 0.1 * torch.randn(sizes["hidden"], generator=generator)
    return x, residual, weight.to(dtype), torch.tensor(1e-5)


def _norm_dynamic() -> tuple[dict | None, ...]:
    tokens, hidden = Dim("tokens", min=1), Dim("hidden", min=2)
    return {0: tokens, 1: hidden}, {0: tokens, 1: hidden}, {0: hidden}, None


def _rope_inputs(rows, sizes, dtype, generator) -> tuple[torch.Tensor, ...]:
    # Q and K heads as the model hands them over: a view of the fused Q/K/V projection (V heads after them).
    heads = sizes["heads"] + sizes["kv_heads"]
    qkv = torch.randn(rows, heads, sizes["head_dim"], generator=generator).to(dtype)
    angles = torch.rand(rows, sizes["head_dim"], generator=generator) * 6.3
    return qkv[:, : sizes["heads"]], angles.cos().to(dtype), angles.sin().to(dtype)


def _rope_dynamic() -> tuple[dict | None, ...]:
    tokens, heads, head_dim = Dim("tokens", min=1), Dim("heads", min=1), 2 * Dim("half_head", min=1)
    return {0: tokens, 1: heads, 2: head_dim}, {0: tokens, 1: head_dim}, {0: tokens, 1: head_dim}


def _silu_inputs(rows, sizes, dtype, generator) -> tuple[torch.Tensor, ...]:
    return (torch.randn(rows, 2 * sizes["intermediate"], generator=generator).to(dtype),)


def _silu_dynamic() -> tuple[dict | None, ...]:
    return ({0: Dim("tokens", min=1), 1: 2 * Dim("inter", min=1)},)


CHAINS = {
    "add_rms_norm": Chain(add_rms_norm, (add_rms_norm, rms_norm), _norm_inputs, _norm_dynamic),
    "rope": Chain(apply_rope, (apply_rope,), _rope_inputs, _rope_dynamic),
    "silu_mul": Chain(silu_mul, (silu_mul,), _silu_inputs, _silu_dynamic),
}
# Small example sizes, all different (export would relate equal sizes): the libraries are shape-generic.
EXAMPLE_SIZES = {"hidden": 40, "heads": 5, "kv_heads": 2, "head_dim": 8, "intermediate": 7}
EXAMPLE_ROWS = 3


def model_sizes(model: nn.Module) -> dict[str, int]:
    """The sizes the chains see in ``model``: hidden width, rotated heads (Q and K), head size, MLP width."""
    config = model.config
    return {
        "hidden": config.hidden_size,
        "heads": config.num_heads + config.num_kv_heads,
        "kv_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "intermediate": config.intermediate_size,
    }


def compiled_chains(dtype: torch.dtype) -> dict[str, Runner]:
    """The library of each chain for ``dtype`` inputs, compiled on this machine's first use (one log line says
    so: it takes minutes); ``{}``, with one log line saying why, where they cannot be built (no C++ compiler,
    say). Either outcome is kept for the rest of the process."""
    libraries = {}
    for name, chain in CHAINS.items():
        examples = chain.inputs(EXAMPLE_ROWS, EXAMPLE_SIZES, dtype, torch.Generator().manual_seed(0))
        examples = tuple(t.contiguous() for t in examples)  # the library is compiled for contiguous inputs
        dynamic = chain.dynamic_shapes()
        library = f"{name}-{str(dtype).removeprefix('torch.')}"
        path = package_path(kernel_cache_dir(), library, chain.sources, examples, dynamic, machine_key({}))
        libraries[name] = (chain.plain, examples, dynamic, path)
    paths = tuple(path for *_, path in libraries.values())
    if paths not in _compiled:
        try:
            missing = [path for path in paths if not path.exists()]
            if missing:
                require_compiler()
                log.warning(
                    "fused CPU ops: compiling %d chains for %s (once per machine, minutes; kept in %s)",
                    len(missing), dtype, shown(missing[0].parent),
                )  # fmt: skip
            _compiled[paths] = {name: compile_function(*library) for name, library in libraries.items()}
        except CompileFailed as error:
            log.warning("fused CPU ops: AOTInductor could not build them (%s); running the plain ops", error)
            _compiled[paths] = {}
    return _compiled[paths]


_compiled: dict[tuple[Path, ...], dict[str, Runner]] = {}  # per set of libraries, this process's outcome


# ---- the fused chains, each behind the checks its library needs ------------------------------------------


def fused_add_rms_norm(run: Runner, dtype: torch.dtype) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``add_rms_norm`` through ``run`` for contiguous ``[T, hidden]`` CPU inputs of ``dtype``; else the
    plain function."""
    eps_tensors: dict[float, torch.Tensor] = {}

    def add_rms_norm_fused(
        x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if (
            residual is None
            or not (x.is_cpu and residual.is_cpu and weight.is_cpu and x.dim() == 2)
            or not x.dtype == residual.dtype == weight.dtype == dtype
            or residual.shape != x.shape
            or weight.shape != x.shape[1:]
            or not (x.shape[0] and x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous())
            or x.requires_grad
            or residual.requires_grad
            or weight.requires_grad
        ):
            return add_rms_norm(x, residual, weight, eps)
        eps_tensor = eps_tensors.get(eps)
        if eps_tensor is None:
            eps_tensor = eps_tensors[eps] = torch.tensor(eps)
        normed, residual = run([x, residual, weight, eps_tensor])
        return normed, residual

    return add_rms_norm_fused


def fused_rope(run: Runner, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """``apply_rope`` through ``run`` for ``[T, H, D]`` CPU heads of ``dtype`` (a strided view is copied
    first, one pass) and contiguous ``[T, D]`` angles; else the plain function."""

    def rope_fused(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if (
            not (qk.is_cpu and cos.is_cpu and sin.is_cpu and qk.dim() == 3)
            or not qk.dtype == cos.dtype == sin.dtype == dtype
            or cos.shape != (qk.shape[0], qk.shape[2])
            or sin.shape != cos.shape
            or not (qk.shape[0] and cos.is_contiguous() and sin.is_contiguous())
            or qk.shape[2] % 2
            or qk.requires_grad
        ):
            return apply_rope(qk, cos, sin)
        return run([qk.contiguous(), cos, sin])[0]

    return rope_fused


def fused_silu_mul(run: Runner, dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """``silu_mul`` through ``run`` for contiguous ``[T, 2I]`` CPU inputs of ``dtype``; else the plain one."""

    def silu_mul_fused(gate_up: torch.Tensor) -> torch.Tensor:
        if (
            not (gate_up.is_cpu and gate_up.dtype == dtype and gate_up.dim() == 2 and gate_up.is_contiguous())
            or not gate_up.shape[0]
            or gate_up.shape[1] % 2
            or gate_up.requires_grad
        ):
            return silu_mul(gate_up)
        return run([gate_up])[0]

    return silu_mul_fused


FUSED = {"add_rms_norm": fused_add_rms_norm, "rope": fused_rope, "silu_mul": fused_silu_mul}


# ---- measuring and choosing -------------------------------------------------------------------------------


def decision_key(name: str, sizes: dict[str, int], dtype: torch.dtype) -> str:
    shape = {
        "add_rms_norm": f"{sizes['hidden']}",
        "rope": f"{sizes['heads']}x{sizes['head_dim']}",
        "silu_mul": f"{sizes['intermediate']}",
    }[name]
    return f"{str(dtype).removeprefix('torch.')}:{name}:{shape}"


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


def _agrees(got, expected, dtype: torch.dtype) -> bool:
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    pairs = list(zip(_outputs(got), _outputs(expected), strict=True))
    return all(
        a.shape == b.shape and float((a.double() - b.double()).norm()) <= tolerance * float(b.double().norm())
        for a, b in pairs
    )


@torch.inference_mode()
def measure_chain(name: str, fused: Callable, sizes: dict[str, int], dtype: torch.dtype) -> dict[str, dict]:
    """Time the plain and the fused chain at ``sizes`` in each regime: ``{regime: {"path", "us"}}`` as
    ``cpu_linear.measure_shape`` returns it. A fused chain whose output differs from the plain one's is not
    timed (so never chosen)."""
    plain, generator = CHAINS[name].plain, torch.Generator().manual_seed(0)
    entry = {}
    for regime, rows in REGIMES.items():
        args = CHAINS[name].inputs(rows, sizes, dtype, generator)
        if name == "add_rms_norm":
            args = (*args[:3], 1e-5)  # the model passes eps as a float
        calls = {"plain": [functools.partial(plain, *args)] * CALLS_PER_ROUND}
        if _agrees(fused(*args), plain(*args), dtype):
            calls["compiled"] = [functools.partial(fused, *args)] * CALLS_PER_ROUND
        best = fastest_rounds(calls)
        us = {n: round(t * 1e6, 2) for n, t in best.items()}
        entry[regime] = {"path": min(us, key=us.get), "us": us}
    return entry


def _by_rows(choices: dict[str, Callable]) -> Callable:
    """One function when every regime chose the same; else a dispatch on the first dimension (tokens)."""
    if len(set(choices.values())) == 1:
        return choices["decode"]
    decode, batch, prefill = (choices[regime] for regime in REGIMES)

    def by_rows(x: torch.Tensor, *args: Any) -> Any:
        rows = x.shape[0]
        return (decode if rows == 1 else batch if rows < PREFILL_ROWS else prefill)(x, *args)

    return by_rows


def cpu_layer_ops(model: nn.Module, use_cache: bool = True) -> LayerOps:
    """The fastest ``LayerOps`` for ``model`` on this CPU: ``PLAIN_OPS`` unless a fused chain measures faster.

    The decisions used (key -> ``{regime: {path, us}}``) are kept as ``model.layer_ops_decisions``.
    """
    if not __name__.startswith("solutions."):  # labs/: the learner's functions run as they wrote them
        return PLAIN_OPS
    dtype, sizes = model.norm.weight.dtype, model_sizes(model)
    fused = {name: FUSED[name](run, dtype) for name, run in compiled_chains(dtype).items()}
    keys = {name: decision_key(name, sizes, dtype) for name in fused}
    measures = {keys[n]: functools.partial(measure_chain, n, fn, sizes, dtype) for n, fn in fused.items()}
    machine = machine_key({"paths": list(PATHS), "regimes": REGIMES})
    decisions = {}
    if fused:
        decisions = cached_decisions(measures, use_cache, cache_dir() / CACHE_FILE, machine, PATHS, REGIMES)
    model.layer_ops_decisions = {keys[name]: decisions[keys[name]] for name in fused}
    chosen = {}
    for name, chain in CHAINS.items():
        picks = model.layer_ops_decisions.get(keys.get(name), {})
        chosen[name] = _by_rows(
            {r: fused[name] if picks.get(r, {}).get("path") == "compiled" else chain.plain for r in REGIMES}
        )
    if all(chosen[name] is CHAINS[name].plain for name in CHAINS):
        return PLAIN_OPS
    return LayerOps("cpu-fused", chosen["add_rms_norm"], chosen["rope"], chosen["silu_mul"])
