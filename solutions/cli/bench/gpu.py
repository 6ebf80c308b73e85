"""``python -m solutions bench gpu``: the engine on a GPU in one run, every figure beside its peers.

For each named shape (a real model's config with random bfloat16 weights, see ``model_shapes``) it first
builds the engines its sections use and records their start-up (``engines``: build seconds, the decode
kernel's tuning, each graph bucket's capture seconds and device memory), so no tuning or capture runs in a
timed region, then measures:

- decode: batch-1 decode tok/s of this engine eager (``enforce_eager=True``), this engine with its default
  (CUDA graphs where the engine has them), the same sampling (temperature 0.8, top-p 0.95), on CUDA the same
  with INT4 weights (W4A16: RTN codes in AWQ's format, which time as AWQ's do) and Hugging Face ``generate``
  on the same folder, against the roofline (weight bytes per token over the measured copy bandwidth);
- profile: one decode step's wall time vs GPU busy time, kernels, host syncs and copies (``torch.profiler``);
- sweep: steady-state decode at batch 1, 2, 4, ... max_num_seqs: per-request and aggregate tok/s;
- throughput: nano-vllm's workload (``benchmarks/bench.py`` there: 256 requests, random token ids below
  10,000, prompt and output lengths uniform in [100, 1024], EOS ignored), greedy, this engine vs HF static
  batches, after a warm-up on other prompts of the same lengths (the prefill kernel's keys tuned there; the
  keys tuned inside the timed run are counted); where the engine overlaps its scheduling (on CUDA), the same
  workload again with overlap scheduling off (prompts shifted by one token id, so none is cached);

then EAGLE chain and n-gram speculative decoding at batch 1 on the bundled model, when it is installed.
Sections are guarded and time-boxed; the JSON and markdown under ``--out`` are rewritten after each one and
whenever a section has a new row (``bench/gpu_report.py`` keeps the record). On a CPU, ``--graph-stand-in``
gives the "graphs" engine recorded graphs (``cuda_graphs.RecordedCall``): ``tools/gpu_session.sh --dry-run``
runs the GPU session's sections so. How much each section measures is ``Sizes`` (``FULL``, or
``QUICK`` with ``--quick``); a shape's models are ``ShapeModels``, each built on first use.
"""

from __future__ import annotations

import collections
import gc
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...bench.decode import decode_speeds, hf_generate, load_hf_model
from ...bench.decode_steps import decode_step_times, profile_decode_steps, random_prompts, start_decodes
from ...bench.gpu_report import Report, Section, SectionSkipped, run_header
from ...bench.kv import kv_bytes_per_token
from ...bench.model_shapes import SHAPES, write_bundled_checkpoint, write_random_checkpoint
from ...bench.roofline import decode_bytes_per_token
from ...bench.step_split import step_breakdown
from ...bench.throughput import Workload, make_workload, run_engine, run_hf_static
from ...bench.timing import bandwidth_gbps, device_sync, timer_name
from ...config import EngineConfig
from ...engine.cuda_graphs import RecordedCall
from ...kernels.blocks import cdiv
from ...kernels.tuning import tuned_key_count
from ...llm import LLM
from ...model import loader
from ...sampling_params import SamplingParams
from . import bench_parser
from .spec import batch_one_engines, chain_methods, chat, held_back_prompts, time_methods

if TYPE_CHECKING:
    from transformers import PreTrainedModel

SECTIONS = ("bandwidth", "decode", "profile", "sweep", "throughput", "spec")
ENGINE_SECTIONS = (
    "decode",
    "profile",
    "sweep",
    "throughput",
)  # a shape's sections, after "model" and "engines"
DEFAULT_SHAPES = ("smollm2-1.7b", "smollm2-135m")
BUDGET_S = dict(  # seconds
    bandwidth=30, model=60, engines=120, decode=75, profile=45, sweep=60, throughput=180, spec=60
)
SPEC_RESERVE_S = 45  # kept for the speculative rows (run last) when the shapes' sections near the time limit
LOAD_S_PER_GB = 6  # added to the budgets of the sections that write or load a shape's weights, per load
WEIGHT_LOADS = {"engines": 4}  # the model section writes them once; the engines section loads them
CPU_KV_CACHE_BYTES = 256 << 20
ENGINES = ("eager", "graphs")
INT4_KV_CACHE_BYTES = 2 << 30


# How much each section measures, field: (FULL, QUICK) side by side. step_prompt is the prompt length of the
# step profile's and the sweep's requests; requests, prompt_lens, output_lens and hf_batch the throughput's.
PRESETS = {
    "copy_bytes": (2 << 30, 64 << 20), "copy_repeats": (10, 3),
    "decode_prompt": (32, 8), "decode_tokens": (128, 16), "decode_repeats": (3, 2),
    "step_prompt": (128, 16), "warmup_steps": (3, 2), "timed_steps": (20, 5), "profiled_steps": (10, 3),
    "profile_batches": ((1, 64), (1, 4)), "sweep_max_batch": (256, 8),
    "requests": (256, 16), "prompt_lens": ((100, 1024), (8, 48)), "output_lens": ((100, 1024), (8, 48)),
    "hf_batch": (64, 8), "spec_prompts": (4, 1), "spec_tokens": (96, 16),
}  # fmt: skip
Sizes = collections.namedtuple("Sizes", PRESETS)
FULL, QUICK = (Sizes(*(pair[i] for pair in PRESETS.values())) for i in (0, 1))


SAMPLED = dict(temperature=0.8, top_p=0.95, seed=0)  # the decode section's sampled row, beside greedy
LABELS = {
    "hf": "HF transformers generate",
    "sampled": "this engine's default, sampled (temperature 0.8, top-p 0.95, seeded)",
    "int4": "this engine, INT4 W4A16 weights (RTN codes: AWQ's format and kernel), CUDA graphs",
    "eager": "this engine, enforce_eager=True",
}


def label(kind: str, device: str, stand_in: bool = False) -> str:
    graphs = " (CUDA graphs)" if device.startswith("cuda") else " (no graphs on a CPU)"
    if stand_in and not device.startswith("cuda"):
        graphs = " (the graph stand-in on a CPU)"
    return LABELS.get(kind, "this engine, enforce_eager=False" + graphs)


def engines_for(sections: Iterable[str], device: str) -> list[str]:
    """The engines (and "hf") the selected sections use, in the order they are built."""
    wanted = {
        "decode": ["eager", "graphs", *(["int4"] if device.startswith("cuda") else []), "hf"],
        "profile": list(ENGINES), "sweep": list(ENGINES), "throughput": ["graphs", "hf"],
    }  # fmt: skip
    return list(
        dict.fromkeys(kind for section in ENGINE_SECTIONS if section in sections for kind in wanted[section])
    )


class ShapeModels:
    """One shape's checkpoint folder and, built on first use, its engines ("eager", "graphs", "int4") and HF
    model, sized for the selected ``sections`` (their longest request sets ``max_model_len``, which bounds the
    decode tuning at start-up). ``graph_stand_in``: on a CPU, the "graphs" engine replays recorded graphs
    (``RecordedCall``)."""

    def __init__(
        self,
        name: str,
        folder: Path,
        device: str,
        sizes: Sizes,
        max_num_seqs: int,
        graph_stand_in: bool = False,
        sections: Iterable[str] = ENGINE_SECTIONS,
    ):
        self.name, self.folder, self.device, self.sections = name, folder, device, set(sections)
        self.sizes, self.max_num_seqs, self.graph_stand_in = sizes, max_num_seqs, graph_stand_in
        self.dtype = EngineConfig(device=device).dtype
        self.built: dict = {}

    def write(self, section: Section) -> None:
        start, bundled = time.perf_counter(), self.name == "bundled"
        if bundled:
            _, self.shape = write_bundled_checkpoint(self.folder)
        else:
            self.shape = SHAPES[self.name]
            write_random_checkpoint(self.shape, self.folder, self.device)
        s = self.sizes
        lengths = {
            "throughput": sum(r[1] for r in (s.prompt_lens, s.output_lens)),
            "decode": s.decode_prompt + s.decode_tokens,
            "profile": s.step_prompt + s.warmup_steps + s.timed_steps + s.profiled_steps,
            "sweep": s.step_prompt + s.warmup_steps + s.timed_steps,
        }
        longest = max(length for section, length in lengths.items() if section in self.sections)
        self.max_model_len = min(self.shape.max_position_embeddings, longest + 16)
        self.kv_cache_bytes = self._kv_cache_bytes()
        weights = "its Q4_1 weights dequantized to bfloat16" if bundled else "random bfloat16 weights"
        section.out.update(
            shape=self.name, source=self.shape.source, config=self.shape.hf_config(), weights=weights,
            weight_bytes=self.shape.weight_bytes(), write_s=time.perf_counter() - start, dtype=self.dtype,
            kv_cache_bytes=self.kv_cache_bytes, max_model_len=self.max_model_len,
        )  # fmt: skip

    def _kv_cache_bytes(self) -> int:
        """On a GPU: what is left of 80% of its memory after three copies of the weights (two engines and HF)
        and HF's cache for one static batch, split between the two engines (2-40 GiB each)."""
        if not self.device.startswith("cuda"):
            return CPU_KV_CACHE_BYTES
        shape = self.shape
        total = torch.cuda.get_device_properties(torch.device(self.device)).total_memory
        token_bytes = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype_bytes=2)
        hf_cache = self.sizes.hf_batch * self.max_model_len * token_bytes
        each = (0.8 * total - 3 * shape.weight_bytes() - hf_cache) / 2
        return int(min(max(each, 2 << 30), 40 << 30))

    def llm(self, kind: str) -> LLM:
        if kind not in self.built:
            # The INT4 engine only decodes one sequence: a small cache leaves room for the other three models.
            self.built[kind] = LLM(
                model=str(self.folder), skip_tokenizer_init=True, device=self.device,
                max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                kv_cache_memory=INT4_KV_CACHE_BYTES if kind == "int4" else self.kv_cache_bytes,
                enforce_eager=kind == "eager", quantization="rtn" if kind == "int4" else None,
                # the stand-in overlaps its scheduling as CUDA does, so the dry run covers that path too
                async_scheduling=True if kind == "graphs" and self.graph_stand_in else None,
            )  # fmt: skip
            engine = self.built[kind].engine
            if kind == "graphs" and self.graph_stand_in and engine.device.type == "cpu":
                engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
        return self.built[kind]

    def hf(self) -> PreTrainedModel:
        if "hf" not in self.built:
            self.built["hf"] = load_hf_model(self.folder, getattr(torch, self.dtype), self.device)
        return self.built["hf"]

    def release(self, *kinds: str) -> None:
        for kind in kinds or list(self.built):
            self.built.pop(kind, None)
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def batches(self, wanted: Iterable[int]) -> list[int]:
        return [b for b in wanted if b <= self.max_num_seqs]


def measure_engines(models: ShapeModels, kinds: list[str], section: Section) -> None:
    """Build each engine (and HF's model) the shape's sections use, a row each as it is built: seconds in all,
    and from the engine's start-up record the decode kernel's tuning (seconds, calls) and each graph's capture
    (bucket, seconds, MiB)."""
    section.out["rows"] = []
    for kind in kinds:
        start = time.perf_counter()
        if kind == "hf":
            models.hf()
            row = {"engine": kind, "build_s": time.perf_counter() - start}
        else:
            startup = models.llm(kind).engine.runner.startup
            captures = startup.get("captures", [])
            row = {
                "engine": kind, "build_s": time.perf_counter() - start, "tune_s": startup["tune_s"],
                "tuned_calls": startup["tuned_calls"], "capture_s": sum(c["seconds"] for c in captures),
                "captures": captures,
            }  # fmt: skip
        section.out["rows"].append(row)
        section.save()


def measure_decode(models: ShapeModels, bandwidth_GBps: float | None, section: Section) -> None:
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    prompt = random_prompts(1, s.decode_prompt, models.shape.vocab_size, seed=1)[0]
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    sampled = lambda n: SamplingParams(**SAMPLED, max_tokens=n, ignore_eos=True)
    runs = {}
    for kind in (*ENGINES, "int4") if device.startswith("cuda") else ENGINES:
        llm = models.llm(kind)
        runs[kind] = lambda n, llm=llm: (llm.generate([prompt], greedy(n), use_tqdm=False), sync())
    graphs = models.llm("graphs")
    runs["sampled"] = lambda n: (graphs.generate([prompt], sampled(n), use_tqdm=False), sync())
    ids = torch.tensor([prompt], device=device)
    runs["hf"] = lambda n: (hf_generate(models.hf(), ids, n), sync())
    weight_bytes = decode_bytes_per_token(graphs.engine.model)
    roofline = bandwidth_GBps * 1e9 / weight_bytes if bandwidth_GBps else None
    section.out.update(
        prompt_tokens=s.decode_prompt, new_tokens=s.decode_tokens, repeats=s.decode_repeats,
        weight_bytes_per_token=weight_bytes, roofline_tok_s=roofline, sampled=LABELS["sampled"],
    )  # fmt: skip
    int4_bytes = stored_bytes_per_token(models.llm("int4").engine.model) if "int4" in runs else None
    # The INT4 engine against its own roofline: its bytes per token at the same bandwidth.
    own_bytes = {"int4": int4_bytes}
    share = lambda kind, speed: speed * own_bytes.get(kind, weight_bytes) / (bandwidth_GBps * 1e9)

    def write(speeds: dict[str, float]) -> None:
        """The rows and ratios from the medians so far, saved at once."""
        section.out["rows"] = [
            {
                "engine": kind, "label": label(kind, device, models.graph_stand_in), "tok_s": speed,
                "ms_per_token": 1e3 / speed, "roofline_share": share(kind, speed) if roofline else None,
                **({"weight_bytes_per_token": int4_bytes} if kind == "int4" else {}),
            }
            for kind, speed in speeds.items()
        ]  # fmt: skip
        section.out["ratios"] = {
            "graphs_vs_eager": speeds["graphs"] / speeds["eager"],
            "graphs_vs_hf": speeds["graphs"] / speeds["hf"],
            "eager_vs_hf": speeds["eager"] / speeds["hf"],
            "sampled_vs_greedy": speeds["sampled"] / speeds["graphs"],
            **({"int4_vs_graphs": speeds["int4"] / speeds["graphs"]} if "int4" in speeds else {}),
        }
        section.save()

    decode_speeds(runs, s.decode_tokens, s.decode_repeats, write)
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


def measure_steps(models: ShapeModels, section: Section, profile: bool) -> None:
    """The step profile (``profile``: at ``profile_batches``) or the batch sweep (batch 1, 2, 4, ... up to
    ``sweep_max_batch``): a row per engine and batch, each at most ``max_num_seqs``."""
    s = models.sizes
    section.out.update(prompt_tokens=s.step_prompt, timed_steps=s.timed_steps, rows=[])
    if profile:
        section.out.update(profiled_steps=s.profiled_steps, on_cuda=models.device.startswith("cuda"))
    batches = s.profile_batches if profile else [2**i for i in range(s.sweep_max_batch.bit_length())]
    for kind in ENGINES:
        for batch in models.batches(batches):
            section.out["rows"].append(_steady_steps(models, kind, batch, profile))
            section.save()


def measure_throughput(models: ShapeModels, section: Section) -> None:
    """The workload through this engine (CUDA graphs) and through HF static batches, as ``bench throughput``
    runs them, HF's batches cut where the section's time runs out. The engine first warms up on other prompts
    of the workload's lengths (two tokens each), so its prefill kernel is tuned before the timed run; the keys
    tuned inside that run are counted (``keys_tuned_in_timed_run``, 0 where nothing is tuned)."""
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
    vocab = min(10_000, models.shape.vocab_size)
    others = make_workload(
        None, s.requests, s.prompt_lens, s.output_lens, 1, vocab
    ).prompts  # seed 1: no hits
    llm.generate(others, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True), use_tqdm=False)
    name = label("graphs", device, models.graph_stand_in) + f", max_num_seqs={models.max_num_seqs}"
    tuned_before = tuned_key_count()
    ours = run_engine(llm, workload, name, sync)
    section.out["keys_tuned_in_timed_run"] = tuned_key_count() - tuned_before
    section.out["rows"] = [_throughput_row("graphs", ours.name, ours)]
    section.save()
    if llm.engine.overlap:  # the same engine with overlap scheduling off, on prompts it has not cached
        shifted = Workload([[(t + 1) % vocab for t in p] for p in workload.prompts], workload.output_lens)
        llm.engine.overlap = False
        try:
            sync_run = run_engine(llm, shifted, name + ", overlap scheduling off", sync)
        finally:
            llm.engine.overlap = True
        section.out["rows"].append(_throughput_row("graphs-sync", sync_run.name, sync_run))
        section.out["overlap_ratio"] = ours.output_tokens_per_s / sync_run.output_tokens_per_s
        section.save()
    hf_generate(models.hf(), torch.ones(2, 4, dtype=torch.long, device=device), 2)  # warm-up
    hf = run_hf_static(models.hf(), workload, s.hf_batch, 0, sync, section.seconds_left)
    batches = f"the first {cdiv(hf.requests, s.hf_batch)} of {cdiv(len(workload.prompts), s.hf_batch)}"
    hf_label = f"{hf.name} in arrival order (left-padded, unsorted): {batches}"
    section.out["rows"].append(_throughput_row("hf", hf_label, hf))
    section.out["ratio_vs_hf"] = ours.output_tokens_per_s / hf.output_tokens_per_s


def _throughput_row(engine: str, name: str, r) -> dict:
    return {
        "engine": engine, "label": name, "requests": r.requests, "output_tokens": r.output_tokens,
        "wall_s": r.wall_s, "output_tok_s": r.output_tokens_per_s,
    }  # fmt: skip


def measure_speculative(device: str, sizes: Sizes, section: Section) -> None:
    """``bench gpu``'s speculative rows: plain (the engine's default), n-gram and EAGLE chains of 3 drafts on
    the first held-back prompts, bundled model, each engine warmed up first; then one prompt's steps by
    part."""
    try:
        loader.bundled_model_path()
    except FileNotFoundError as missing:
        raise SectionSkipped(
            f"the EAGLE and n-gram rows need the bundled model ({loader.INSTALL_HINT})"
        ) from missing
    engines = batch_one_engines(chain_methods(3), device, CPU_KV_CACHE_BYTES)
    for llm in engines.values():
        llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    sync, plain = device_sync(device), engines["plain"]
    prompts = [chat(plain, text) for text in held_back_prompts()[: sizes.spec_prompts]]
    params = SamplingParams(temperature=0, max_tokens=sizes.spec_tokens, ignore_eos=True)
    totals = time_methods(engines, prompts, params, sync)
    section.out.update(
        model=f"bundled {loader.BUNDLED_FILE}, {plain.engine.config.dtype}",
        prompts=len(prompts), max_tokens=sizes.spec_tokens,
    )  # fmt: skip
    section.out["rows"] = [
        {"method": name, "enforce_eager": engines[name].engine.config.enforce_eager, "tok_s": t["tok_s"],
         "speedup": t["tok_s"] / totals["plain"]["tok_s"], "tau": t["tau"], "outputs_differing": t["differ"]}
        for name, t in totals.items()
    ]  # fmt: skip
    section.out["breakdown"] = [
        {"method": name, **step_breakdown(llm, prompts[0], params, sync)} for name, llm in engines.items()
    ]


def bench_shape(
    report: Report,
    name: str,
    device: str,
    sizes: Sizes,
    sections: list[str],
    max_num_seqs: int,
    graph_stand_in: bool = False,
) -> None:
    """Every selected section of one shape, in order, within the run's deadline less the spec rows' share:
    the checkpoint, the engines they use (every tuning and capture, before any timed region), then each."""
    reserve = SPEC_RESERVE_S if "spec" in sections else 0.0
    shape_out = report.data.setdefault("shapes", {}).setdefault(name, {})
    load_s = LOAD_S_PER_GB * (SHAPES[name].weight_bytes() / 1e9 if name in SHAPES else 1)
    with tempfile.TemporaryDirectory(prefix=f"fastmode-bench-{name}-") as folder:
        models = ShapeModels(name, Path(folder), device, sizes, max_num_seqs, graph_stand_in, sections)
        try:
            if not report.section(shape_out, "model", BUDGET_S["model"] + load_s, models.write, reserve):
                return
            build = lambda sec: measure_engines(models, engines_for(sections, device), sec)
            budget = BUDGET_S["engines"] + WEIGHT_LOADS["engines"] * load_s
            if not report.section(shape_out, "engines", budget, build, reserve):
                return
            bandwidth = report.data.get("bandwidth", {}).get("copy_GBps")
            measures = {
                "decode": lambda sec: measure_decode(models, bandwidth, sec),
                "profile": lambda sec: measure_steps(models, sec, profile=True),
                "sweep": lambda sec: measure_steps(models, sec, profile=False),
                "throughput": lambda sec: measure_throughput(models, sec),
            }
            for key, measure in measures.items():
                budget = BUDGET_S[key]
                if key in sections and not report.section(shape_out, key, budget, measure, reserve):
                    models.release()  # a section cut short can leave requests in flight: start afresh
        finally:
            models.release()


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    known = ", ".join([*SHAPES, "bundled"])
    add("--shapes", "--shape", nargs="+", default=None, metavar="SHAPE",
        help=f"any of {known} (default on CUDA: {' '.join(DEFAULT_SHAPES)}; on a CPU: tiny)")  # fmt: skip
    add("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS, metavar="SECTION",
        help=f"any of {', '.join(SECTIONS)} (default: all)")  # fmt: skip
    add("--quick", action="store_true", help="small sizes everywhere: a smoke test, not a measurement")
    add("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda when present)")
    add("--max-num-seqs", type=int, default=256, help="the engines' max_num_seqs; caps the sweep")
    add("--requests", type=int, default=None, help="throughput requests (default 256; --quick 16)")
    add("--hf-batch", type=int, default=None, help="HF static batch size (default 64; --quick 8)")
    add("--time-limit", type=float, default=470, help="seconds; later sections are skipped past it")
    add("--out", default="results", help="folder for the JSON and markdown (default: results)")
    add("--commit", default=None, help="the commit measured (default: git describe, when in git)")
    add("--graph-stand-in", action="store_true",
        help="on a CPU: the 'graphs' engine replays recorded graphs (the GPU session's dry run)")  # fmt: skip
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: torch sees no CUDA GPU")
    shapes = args.shapes or (list(DEFAULT_SHAPES) if device.startswith("cuda") else ["tiny"])
    unknown = [s for s in shapes if s not in SHAPES and s != "bundled"]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: choose from {known}")
    if args.max_num_seqs < 1 or (args.requests or 1) < 1 or (args.hf_batch or 1) < 1:
        parser.error("--max-num-seqs, --requests and --hf-batch must be positive")
    sizes = QUICK if args.quick else FULL
    sizes = sizes._replace(requests=args.requests or sizes.requests, hf_batch=args.hf_batch or sizes.hf_batch)
    command = "python -m solutions bench gpu " + shlex.join(sys.argv[1:] if argv is None else argv)
    header = run_header(device, command, args.commit, "quick" if args.quick else "full", args.time_limit)
    report = Report(Path(args.out), header, args.time_limit)
    print(
        f"bench gpu on {header['machine']}: shapes {', '.join(shapes)}; sections {', '.join(args.sections)}; "
        f"writing {report.json_path} and .md after each section",
        flush=True,
    )
    if "bandwidth" in args.sections:
        copy = lambda sec: sec.out.update(
            bytes=sizes.copy_bytes,
            timer=timer_name(device, sizes.copy_repeats),
            copy_GBps=bandwidth_gbps(sizes.copy_bytes, device, repeats=sizes.copy_repeats),
        )
        report.section(report.data, "bandwidth", BUDGET_S["bandwidth"], copy)
    for name in shapes if set(args.sections) & set(ENGINE_SECTIONS) else []:
        bench_shape(report, name, device, sizes, args.sections, args.max_num_seqs, args.graph_stand_in)
    if "spec" in args.sections:
        report.section(
            report.data, "speculative", BUDGET_S["spec"], lambda sec: measure_speculative(device, sizes, sec)
        )
    sections = [report.data.get("bandwidth"), report.data.get("speculative")]
    sections += [s for shape in report.data.get("shapes", {}).values() for s in shape.values()]
    failed = [s for s in sections if s and s["status"] in ("failed", "timed out")]
    print(f"wrote {report.json_path} and {report.md_path}; {len(failed)} section(s) failed or timed out")
    return 1 if failed else 0
