"""The CPU ``LayerOps`` candidates side by side: ``bench decode --fused-ops ENGINE``.

Three tables, each measured with rounds alternating between the candidates (this machine is noisy):

- per chain and regime (1, 8, 128 rows), microseconds per call of the plain chain and of the fused one
  compiled ahead of time, as ``model/cpu_layer_ops.py`` measured them to choose (the cached decisions);
- per chain at one row, the same fused chain through ``torch.compile`` (dynamo, ``dynamic=True``): the guard
  evaluation every call pays, which is why the engine compiles ahead of time instead;
- whole decode steps of one engine, its layer ops switched between ``PLAIN_OPS`` and the fused set before each
  run (``bench decode``'s alternating repeats), with the greedy tokens of both compared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..engine.outputs import RequestOutput
from ..kernels.cpu_linear import fastest_rounds
from ..llm import LLM
from ..model.cpu_layer_ops import CHAINS, model_sizes
from ..model.llama import PLAIN_OPS, LayerOps, LlamaModel
from ..sampling_params import SamplingParams
from .decode import decode_speeds


def decision_lines(decisions: dict[str, dict]) -> list[str]:
    """One line per chain and regime: the winner and each candidate's microseconds per call."""
    lines = [f"{'dtype:chain:shape':<28}{'regime':<9}{'winner':<10}microseconds per call"]
    for key, entry in decisions.items():
        for regime, pick in entry.items():
            figures = "  ".join(f"{name} {us:7.2f}" for name, us in sorted(pick["us"].items()))
            lines.append(f"{key:<28}{regime:<9}{pick['path']:<10}{figures}")
    return lines


def torch_compile_lines(model: LlamaModel, fused_ops: LayerOps) -> list[str]:
    """Per chain at one row: plain, the engine's fused chain, and ``torch.compile`` of the plain function."""
    dtype, sizes = model.norm.weight.dtype, model_sizes(model)
    lines = [f"{'chain (1 row)':<16}{'plain us':>10}{'engine us':>11}{'torch.compile us':>18}"]
    for name, chain in CHAINS.items():
        args = chain.inputs(1, sizes, dtype, torch.Generator().manual_seed(0))
        if name == "add_rms_norm":
            args = (*args[:3], 1e-5)
        compiled = torch.compile(chain.plain, dynamic=True)
        with torch.inference_mode():
            compiled(*args)  # compiles
            candidates = {"plain": chain.plain, "engine": getattr(fused_ops, name), "compile": compiled}
            best = fastest_rounds({n: [functools.partial(fn, *args)] * 32 for n, fn in candidates.items()}, 7)
        us = {n: t * 1e6 for n, t in best.items()}
        lines.append(f"{name:<16}{us['plain']:>10.2f}{us['engine']:>11.2f}{us['compile']:>18.2f}")
    return lines


def step_ab_lines(llm: LLM, fused_ops: LayerOps, prompt: str, tokens: int, repeats: int) -> list[str]:
    """Decode ms/token of ``llm`` with ``PLAIN_OPS`` and with ``fused_ops``, alternating; and whether the
    greedy tokens agree."""
    model = llm.engine.model
    before = model.ops
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)

    def run_with(ops: LayerOps) -> Callable[[int], list[RequestOutput]]:
        def run(n: int) -> list[RequestOutput]:
            model.use_ops(ops)
            return llm.generate(prompt, greedy(n))

        return run

    runs = {"plain ops": run_with(PLAIN_OPS), f"{fused_ops.name} ops": run_with(fused_ops)}
    try:
        tokens_of = {name: run(tokens)[0].outputs[0].token_ids for name, run in runs.items()}
        speeds = decode_speeds(runs, tokens, repeats)
    finally:
        model.use_ops(before)
    plain_ms = 1e3 / speeds["plain ops"]
    lines = [f"{'layer ops':<20}{'ms/token':>10}{'vs plain':>10}"]
    for name, speed in speeds.items():
        lines.append(f"{name:<20}{1e3 / speed:>10.2f}{plain_ms * speed / 1e3:>9.2f}x")
    same = len(set(map(tuple, tokens_of.values()))) == 1
    lines.append(f"greedy tokens ({tokens}): {'identical' if same else 'DIFFER'}")
    return lines
