"""Where a decode step's time goes, and how close prefill runs to the machine's GEMM rate.

- ``linear_seconds``: the model's linear layers alone, run in the order a step runs them, on random
  inputs of ``rows`` rows: at one row that is the time the step spends reading weights; the rest of a
  measured step is everything else (norms, RoPE, attention, the cache, sampling, Python).
- ``measure_step_split``: the same step taken apart while it runs. Timers (``time.perf_counter`` around the
  call) wrap each linear (matrix products), the model's ``attend`` calls (the K/V store and attention, layer
  by layer), its elementwise chains (the ``LayerOps``, the final norm, the embedding lookup) and the engine's
  sampler (logits to token ids); whatever the step spends outside them is Python and other work (scheduling,
  building the step's inputs and attention tables, module calls, outputs). A timer adds well under a
  microsecond per call, and the timed step is reported beside the untimed one.
- ``gemm_flops``: the same linears at a prompt's worth of rows give the machine's GEMM FLOP/s on the
  model's own shapes, the ceiling a prefill is compared with.
- ``batched_split``: a whole batched workload taken apart the same way, step by step, each step filed under
  its kind (prompt chunks only, decodes only, or both mixed): where a batched run's wall time goes.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..engine.outputs import OutputKind
from ..llm import LLM
from ..model.config import ModelConfig
from ..sampling_params import SamplingParams


def step_linears(model: nn.Module) -> list[nn.Module]:
    """Every matrix product of a step, in order:
    each layer's linears, then the LM head (not the embedding)."""
    linears = []
    for layer in model.layers:
        linears += [m for m in layer.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]
    return [*linears, model.lm_head]


@torch.inference_mode()
def linear_seconds(model: nn.Module, rows: int = 1, repeats: int = 5, head_rows: int | None = None) -> float:
    """Fastest of ``repeats`` runs of every linear of a step on ``rows``-row inputs
    (``head_rows`` for the LM head)."""
    linears, dtype, inputs = step_linears(model), model.norm.weight.dtype, {}
    row_counts = [rows] * (len(linears) - 1) + [rows if head_rows is None else head_rows]
    calls = [
        (m, inputs.setdefault((n, m.in_features), torch.randn(n, m.in_features, dtype=dtype)))
        for m, n in zip(linears, row_counts)
    ]
    best = float("inf")
    for _ in range(repeats + 1):  # the first run warms up (and makes any packed layout)
        start = time.perf_counter()
        for linear, x in calls:
            linear(x)
        best = min(best, time.perf_counter() - start)
    return best


def linear_flops(model: nn.Module, rows: int, head_rows: int = 1) -> int:
    """Multiply-adds x 2 of a step's linears with ``rows`` tokens (the LM head sees ``head_rows``)."""
    linears = step_linears(model)
    body = sum(2 * rows * m.in_features * m.out_features for m in linears[:-1])
    return body + 2 * head_rows * model.lm_head.in_features * model.lm_head.out_features


def attention_flops(config: ModelConfig, tokens: int) -> int:
    """q k^T and p v of a causal prefill of ``tokens`` tokens (half the square), every layer."""
    return 2 * 2 * config.num_layers * config.num_heads * config.head_dim * tokens * (tokens + 1) // 2


def gemm_flops(model: nn.Module, rows: int, repeats: int = 3) -> float:
    """FLOP/s of the model's linears on ``rows``-row inputs (each layer's shapes; LM head excluded)."""
    seconds = linear_seconds(model, rows, repeats, head_rows=1)
    return linear_flops(model, rows) / seconds


SPLIT = ("matrix products", "compiled layers", "attention", "elementwise", "sampler", "Python/other")
CHAIN_NAMES = ("add_rms_norm", "rope", "silu_mul")  # the LayerOps functions, timed as elementwise


class StepClock:
    """Seconds spent inside timed calls and how many calls, by part of the step. With a device ``sync``
    each timed call waits for the device at both ends, so nested parts add up to the step on a GPU too."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        seconds, calls, sync = self.seconds, self.calls, self.sync

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            sync()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                sync()
                seconds[part] += time.perf_counter() - start
                calls[part] += 1

        return timed_call

    @contextmanager
    def wrapping(self, targets: list[tuple[Any, str, str]]) -> Iterator[None]:
        """Inside, each ``(owner, attribute, part)`` of ``targets`` is timed as ``part``; on exit every
        attribute is as it was (an instance attribute set, or none)."""
        before = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in targets]
        for owner, name, part in targets:
            setattr(owner, name, self.timed(part, getattr(owner, name)))
        try:
            yield
        finally:
            for owner, name, previous in reversed(before):
                if previous is None:
                    owner.__dict__.pop(name, None)
                else:
                    setattr(owner, name, previous)


class _TimedAttend:
    """The model's ``attend``, every call timed as attention (``rope_store_attend`` too, where offered);
    ``decode_context`` and ``verify_context`` (the compiled layers' ways in) are passed through untimed."""

    def __init__(self, attend, clock: StepClock):
        self._attend, self._call = attend, clock.timed("attention", attend)
        if hasattr(attend, "rope_store_attend"):
            self.rope_store_attend = clock.timed("attention", attend.rope_store_attend)
        for way_in in ("decode_context", "verify_context"):
            if hasattr(attend, way_in):
                setattr(self, way_in, getattr(attend, way_in))

    def __call__(self, layer, q, k, v):
        return self._call(layer, q, k, v)


@contextmanager
def _timers(engine, clock: StepClock) -> Iterator[None]:
    """Wrap the parts of ``engine``'s step in ``clock``'s timers (instance attributes: removed on exit)."""
    model = engine.model
    wrapped = [(m, "forward", "matrix products") for m in step_linears(model)]
    wrapped += [(model.norm, "forward", "elementwise"), (model.embed_tokens, "forward", "elementwise")]
    wrapped += [(engine.runner, "_draw", "sampler"), (engine.runner, "read_tokens", "sampler")]
    ops, forward, fused_decode = model.ops, model.forward, model.fused_decode
    compiled_attention = getattr(fused_decode, "attention", None)
    try:
        if compiled_attention is not None:  # DecodeLayers: its compiled RoPE + store + attention
            fused_decode.attention = clock.timed("attention", fused_decode.attention)
        elif fused_decode is not None:  # whole layers in one call each: their products are inside
            model.fused_decode = clock.timed("compiled layers", fused_decode)
        model.forward = lambda ids, positions, attend: forward(ids, positions, _TimedAttend(attend, clock))
        chains = {f: clock.timed("elementwise", getattr(ops, f)) for f in CHAIN_NAMES}
        model.use_ops(replace(ops, **chains))
        with clock.wrapping(wrapped):
            yield
    finally:
        model.use_ops(ops)
        model.__dict__.pop("forward", None)
        model.fused_decode = fused_decode
        if compiled_attention is not None:
            fused_decode.attention = compiled_attention


@dataclass(frozen=True)
class StepSplit:
    """Milliseconds per decode step by part (``SPLIT``), from the timed steps; ``step_ms`` is their sum."""

    ms: dict[str, float]
    steps: int

    @property
    def step_ms(self) -> float:
        return sum(self.ms.values())


def measure_step_split(llm: LLM, prompt: str, new_tokens: int = 32, repeats: int = 3) -> StepSplit:
    """Time each part of ``llm``'s batch-1 greedy decode steps (``new_tokens`` tokens after ``prompt``; the
    prefill step is left out). Of ``repeats`` runs, the one whose mean step is the median is reported: its
    parts add up to its step."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompt, params)  # warm up
    runs = []
    for _ in range(repeats):
        clock = StepClock()
        with _timers(llm.engine, clock):
            steps = _decode_steps(llm.engine, prompt, params, clock, "final")  # as LLM.generate reports
        ms = {part: 1e3 * clock.seconds[part] / steps for part in SPLIT[:-1]}
        ms["Python/other"] = 1e3 * clock.seconds["step"] / steps - sum(ms.values())
        runs.append(ms)
    middle = sorted(runs, key=lambda r: sum(r.values()))[len(runs) // 2]
    return StepSplit(middle, new_tokens - 1)


def _decode_steps(
    engine, prompt: str | list[int], params: SamplingParams, clock: StepClock, output_kind: OutputKind
) -> int:
    """One request decoded alone, its prefill step untimed and every decode step after it timed as "step"
    (``clock`` cleared after the prefill: its other parts are then the decode steps' alone). Returns how many
    decode steps ran."""
    engine.add_request(prompt, params, output_kind=output_kind)
    engine.step()  # the prefill, left out
    clock.seconds.clear()
    clock.calls.clear()
    while engine.has_unfinished_requests():
        clock.timed("step", engine.step)()
    return clock.calls["step"]


def split_lines(split: StepSplit, products_alone_ms: float, untimed_step_ms: float) -> list[str]:
    """The split as printed by ``bench decode`` and ``bench quant``: ms and share of the step per part."""
    lines = [f"{'part of a decode step':<24}{'ms':>8}{'share':>8}"]
    for part in SPLIT:
        if part == "compiled layers" and not split.ms[part]:
            continue  # a model without them
        lines.append(f"{part:<24}{split.ms[part]:>8.2f}{split.ms[part] / split.step_ms:>8.0%}")
    lines.append(f"{'timed step':<24}{split.step_ms:>8.2f}   (untimed {untimed_step_ms:.2f} ms)")
    lines.append(f"{'matrix products alone':<24}{products_alone_ms:>8.2f}   (the linears back to back)")
    return lines


def step_breakdown(llm: LLM, prompt: list[int], params: SamplingParams, sync: Callable[[], None]) -> dict:
    """One request decoded alone, each step after its prefill split by part with the device synchronised at
    every boundary (so the parts add up to the step, and the step is slower than unsynchronised): ms a step
    drafting (the speculator's ``propose``), in the forward (``runner.execute``) and in the rest (scheduling,
    verifying, sampling, outputs); and the share of forwards replayed from a decode graph."""
    engine, clock = llm.engine, StepClock(sync)
    runner, spec = engine.runner, engine.speculator
    targets = [(runner, "execute", "forward")]
    if runner.graphs is not None:
        targets.append((runner.graphs, "replay", "replayed"))
    if spec is not None:
        targets.append((spec, "propose", "draft"))
    with clock.wrapping(targets):
        steps = _decode_steps(engine, prompt, params, clock, "cumulative")
    step_ms, draft_ms, forward_ms = (
        1e3 * clock.seconds[p] / max(1, steps) for p in ("step", "draft", "forward")
    )
    return {
        "steps": steps,
        "step_ms": step_ms,
        "draft_ms": draft_ms,
        "forward_ms": forward_ms,
        "other_ms": step_ms - draft_ms - forward_ms,
        "graph_share": clock.calls["replayed"] / max(1, clock.calls["forward"]),
    }


STEP_KINDS = ("prefill", "mixed", "decode")


@dataclass(frozen=True)
class KindSplit:
    """The steps of one kind in a batched run: how many, the tokens (rows) they ran, and their seconds by part
    (``SPLIT``; "Python/other" is each step's wall time less its timed parts)."""

    steps: int
    tokens: int
    seconds: dict[str, float]

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


def step_kind(num_scheduled_tokens: dict[str, int]) -> str:
    """A step whose every request runs one token is "decode"; one with none such runs prompt chunks only
    ("prefill"); the rest mix both (a request running more than one token is a prompt chunk, or a preempted
    request's recomputation)."""
    singles = sum(1 for n in num_scheduled_tokens.values() if n == 1)
    if singles == len(num_scheduled_tokens):
        return "decode"
    return "prefill" if singles == 0 else "mixed"


def batched_split(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, KindSplit]:
    """Run ``prompts`` through ``llm``'s engine as ``LLM.generate`` would (all added at once, stepped until
    done) with every part of every step timed, and add each step's parts up under its kind
    (``step_kind``). The timers cost well under a microsecond a call: compare the total with an untimed run
    of the same work."""
    engine, clock = llm.engine, StepClock()
    kinds: list[tuple[str, int]] = []  # each scheduled step's kind and tokens
    schedule = engine.scheduler.schedule

    def schedule_noting_kind():
        plan = schedule()
        if plan.scheduled:
            kinds.append((step_kind(plan.num_scheduled_tokens), plan.total_tokens))
        return plan

    seconds = {kind: defaultdict(float) for kind in STEP_KINDS}
    steps, tokens = Counter(), Counter()
    engine.scheduler.schedule = schedule_noting_kind
    try:
        with _timers(engine, clock):
            for prompt, request_params in zip(prompts, params, strict=True):
                engine.add_request(prompt, request_params)
            while engine.has_unfinished_requests():
                before, ran = dict(clock.seconds), len(kinds)
                start = time.perf_counter()
                engine.step()
                wall = time.perf_counter() - start
                if len(kinds) == ran:
                    continue  # nothing was scheduled
                kind, step_tokens = kinds[-1]
                parts = {part: clock.seconds[part] - before.get(part, 0.0) for part in SPLIT[:-1]}
                parts["Python/other"] = wall - sum(parts.values())
                for part, s in parts.items():
                    seconds[kind][part] += s
                steps[kind] += 1
                tokens[kind] += step_tokens
    finally:
        engine.scheduler.__dict__.pop("schedule", None)
    return {kind: KindSplit(steps[kind], tokens[kind], dict(seconds[kind])) for kind in STEP_KINDS}
