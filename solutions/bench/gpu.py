"""The sections of ``python -m solutions bench gpu`` (``cli/bench/gpu.py`` runs them): copy bandwidth, batch-1
decode against the roofline and its peers, one decode step's profile, and the steady-state batch sweep, each
measured on a shape's models and written into its ``Section`` of the report."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from ..kernels.blocks import cdiv
from ..sampling_params import SamplingParams
from .decode import decode_speeds
from .decode_steps import decode_step_times, profile_decode_steps, random_prompts, start_decodes
from .gpu_report import Report, Section
from .gpu_setup import ENGINES, ShapeModels, Sizes, label
from .hf_peer import hf_generate
from .model_shapes import SHAPES
from .roofline import decode_bytes_per_token
from .throughput import make_workload, run_engine, run_hf_static
from .timing import device_sync

SECTIONS = ("bandwidth", "decode", "profile", "sweep", "throughput", "spec")
DEFAULT_SHAPES = ("smollm2-1.7b", "smollm2-135m")
BUDGET_S = {
    "bandwidth": 30,
    "model": 60,
    "decode": 75,
    "profile": 45,
    "sweep": 60,
    "throughput": 180,
    "spec": 60,
}
SPEC_RESERVE_S = 45  # kept for the speculative rows (run last) when the shapes' sections near the time limit
LOAD_S_PER_GB = 6  # added to the budgets of the sections that write or load a shape's weights


def measure_decode(models: ShapeModels, bandwidth_GBps: float | None, section: Section) -> None:
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    prompt = random_prompts(1, s.decode_prompt, models.shape.vocab_size, seed=1)[0]
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    runs = {}
    for kind in (*ENGINES, "int4") if device.startswith("cuda") else ENGINES:
        llm = models.llm(kind)
        runs[kind] = lambda n, llm=llm: (llm.generate([prompt], greedy(n), use_tqdm=False), sync())
    ids = torch.tensor([prompt], device=device)
    runs["hf"] = lambda n: (hf_generate(models.hf(), ids, n), sync())
    speeds = decode_speeds(runs, s.decode_tokens, s.decode_repeats)
    weight_bytes = decode_bytes_per_token(models.llm("graphs").engine.model)
    roofline = bandwidth_GBps * 1e9 / weight_bytes if bandwidth_GBps else None
    section.out.update(
        prompt_tokens=s.decode_prompt, new_tokens=s.decode_tokens, repeats=s.decode_repeats,
        weight_bytes_per_token=weight_bytes, roofline_tok_s=roofline,
    )  # fmt: skip
    int4_bytes = stored_bytes_per_token(models.llm("int4").engine.model) if "int4" in speeds else None
    # The INT4 engine against its own roofline: its bytes per token at the same bandwidth.
    own_bytes = {"int4": int4_bytes}
    share = lambda kind, speed: speed * own_bytes.get(kind, weight_bytes) / (bandwidth_GBps * 1e9)
    section.out["rows"] = [
        {
            "engine": kind, "label": label(kind, device), "tok_s": speed, "ms_per_token": 1e3 / speed,
            "roofline_share": share(kind, speed) if roofline else None,
            **({"weight_bytes_per_token": int4_bytes} if kind == "int4" else {}),
        }
        for kind, speed in speeds.items()
    ]  # fmt: skip
    section.out["ratios"] = {
        "graphs_vs_eager": speeds["graphs"] / speeds["eager"],
        "graphs_vs_hf": speeds["graphs"] / speeds["hf"],
        "eager_vs_hf": speeds["eager"] / speeds["hf"],
        **({"int4_vs_graphs": speeds["int4"] / speeds["graphs"]} if "int4" in speeds else {}),
    }
    models.release("int4")


def stored_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes a decode step of a quantized model reads, counted as every stored tensor once: its packed codes,
    scales and zero points (buffers) and its float parameters (norms). Exact for a tied embedding (the LM
    head's table); an untied one is counted whole though a step reads one row of it."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _steady_steps(models: ShapeModels, kind: str, batch: int, profile: bool) -> dict:
    """One row of the step profile (``profile``) or the sweep: ``batch`` decodes prefilled, warm-up steps,
    then the median of timed steps (and the profiler's counts over more steps)."""
    s, sync = models.sizes, device_sync(models.device)
    engine = models.llm(kind).engine
    steps = s.warmup_steps + s.timed_steps + (s.profiled_steps if profile else 0)
    ids = start_decodes(engine, batch, s.step_prompt, max_tokens=steps + 2, seed=batch)
    decode_step_times(engine, s.warmup_steps, batch, sync)
    step_ms = 1e3 * statistics.median(decode_step_times(engine, s.timed_steps, batch, sync))
    row = {"engine": kind, "batch": batch}
    if profile:
        counts = profile_decode_steps(engine, s.profiled_steps, batch, models.device)
        busy, kernels = counts["gpu_busy_ms"], counts["kernels"]
        row |= {
            "wall_ms": step_ms,
            **counts,
            "busy_share": None if busy is None else busy / step_ms,
            "kernels_per_layer": None if kernels is None else kernels / models.shape.num_layers,
        }
    else:
        row |= {
            "step_ms": step_ms,
            "per_request_tok_s": 1e3 / step_ms,
            "aggregate_tok_s": batch * 1e3 / step_ms,
        }
    engine.abort(ids)
    return row


def measure_profile(models: ShapeModels, section: Section) -> None:
    s = models.sizes
    section.out.update(
        prompt_tokens=s.step_prompt, timed_steps=s.timed_steps, profiled_steps=s.profiled_steps,
        on_cuda=models.device.startswith("cuda"), rows=[],
    )  # fmt: skip
    for kind in ENGINES:
        for batch in models.batches(s.profile_batches):
            section.out["rows"].append(_steady_steps(models, kind, batch, profile=True))


def measure_sweep(models: ShapeModels, section: Section) -> None:
    s = models.sizes
    section.out.update(prompt_tokens=s.step_prompt, timed_steps=s.timed_steps, rows=[])
    batches = models.batches([2**i for i in range(s.sweep_max_batch.bit_length())])
    for kind in ENGINES:
        for batch in batches:
            section.out["rows"].append(_steady_steps(models, kind, batch, profile=False))


def measure_throughput(models: ShapeModels, section: Section) -> None:
    """The workload through this engine (CUDA graphs) and through HF static batches, as ``bench throughput``
    runs them, HF's batches cut where the section's time runs out."""
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    # nano-vllm's offline workload: random token ids below min(10,000, vocab), seed 0
    workload = make_workload(
        None, s.requests, s.prompt_lens, s.output_lens, 0, min(10_000, models.shape.vocab_size)
    )
    (lo_in, hi_in), (lo_out, hi_out) = s.prompt_lens, s.output_lens
    section.out["workload"] = {
        "description": f"nano-vllm's workload: random token ids, prompt lengths uniform in [{lo_in}, "
        f"{hi_in}], output lengths uniform in [{lo_out}, {hi_out}] (seed 0), greedy, EOS ignored",
        "requests": len(workload.prompts),
        "prompt_tokens": workload.num_prompt_tokens,
        "output_tokens": workload.num_output_tokens,
    }
    models.release("eager")  # room for HF's static batches
    llm = models.llm("graphs")
    warm_up = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(random_prompts(2, 16, models.shape.vocab_size, seed=7), warm_up, use_tqdm=False)
    ours = run_engine(llm, workload, label("graphs", device) + f", max_num_seqs={models.max_num_seqs}", sync)
    hf_generate(models.hf(), torch.ones(2, 4, dtype=torch.long, device=device), 2)  # warm-up
    hf = run_hf_static(models.hf(), workload, s.hf_batch, 0, sync, section.seconds_left)
    batches = f"the first {cdiv(hf.requests, s.hf_batch)} of {cdiv(len(workload.prompts), s.hf_batch)}"
    hf_label = f"{hf.name} in arrival order (left-padded, unsorted): {batches}"
    section.out["rows"] = [
        {"engine": engine, "label": name, "requests": r.requests, "output_tokens": r.output_tokens,
         "wall_s": r.wall_s, "output_tok_s": r.output_tokens_per_s}
        for engine, name, r in (("graphs", ours.name, ours), ("hf", hf_label, hf))
    ]  # fmt: skip
    section.out["ratio_vs_hf"] = ours.output_tokens_per_s / hf.output_tokens_per_s


def bench_shape(
    report: Report, name: str, device: str, sizes: Sizes, sections: list[str], max_num_seqs: int
) -> None:
    """Every selected section of one shape, in order, within the run's deadline less the spec rows' share."""
    reserve = SPEC_RESERVE_S if "spec" in sections else 0.0
    shape_out = report.data.setdefault("shapes", {}).setdefault(name, {})
    load_s = LOAD_S_PER_GB * (SHAPES[name].weight_bytes() / 1e9 if name in SHAPES else 1)
    with tempfile.TemporaryDirectory(prefix=f"fastmode-bench-{name}-") as folder:
        models = ShapeModels(name, Path(folder), device, sizes, max_num_seqs)
        try:
            if not report.section(shape_out, "model", BUDGET_S["model"] + load_s, models.write, reserve):
                return
            bandwidth = report.data.get("bandwidth", {}).get("copy_GBps")
            measures = {
                "decode": (
                    BUDGET_S["decode"] + 3 * load_s,
                    lambda sec: measure_decode(models, bandwidth, sec),
                ),
                "profile": (BUDGET_S["profile"], lambda sec: measure_profile(models, sec)),
                "sweep": (BUDGET_S["sweep"], lambda sec: measure_sweep(models, sec)),
                "throughput": (
                    BUDGET_S["throughput"] + 2 * load_s,
                    lambda sec: measure_throughput(models, sec),
                ),
            }
            for key, (budget, measure) in measures.items():
                if key in sections and not report.section(shape_out, key, budget, measure, reserve):
                    models.release()  # a section cut short can leave requests in flight: start afresh
        finally:
            models.release()
