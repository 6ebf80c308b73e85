"""``python -m solutions bench gpu``: the engine on a GPU in one run, every figure beside its peers.

For each named shape (a real model's config with random bfloat16 weights, see ``model_shapes``) it measures:

- decode: batch-1 decode tok/s of this engine eager (``enforce_eager=True``), this engine with its default
  (CUDA graphs where the engine has them) and Hugging Face ``generate`` on the same folder, against the
  roofline (weight bytes per token over the measured copy bandwidth);
- profile: one decode step's wall time vs GPU busy time, kernels, host syncs and copies (``torch.profiler``);
- sweep: steady-state decode at batch 1, 2, 4, ... max_num_seqs: per-request and aggregate tok/s;
- throughput: nano-vllm's workload (``benchmarks/bench.py`` there: 256 requests, random token ids below
  10,000, prompt and output lengths uniform in [100, 1024], EOS ignored), greedy, this engine vs HF static
  batches;

then EAGLE chain and n-gram speculative decoding at batch 1 on the bundled model, when it is installed.
Sections are guarded and time-boxed; the JSON and markdown under ``--out`` are rewritten after each one.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..config import EngineConfig
from ..engine.sampling_params import SamplingParams
from .decode import decode_speeds
from .decode_steps import (
    decode_step_times,
    device_sync,
    median_ms,
    profile_decode_steps,
    random_prompts,
    start_decodes,
)
from .gpu_report import Report, Section, SectionSkipped, run_header
from .model_shapes import SHAPES, write_bundled_checkpoint, write_random_checkpoint
from .roofline import decode_bytes_per_token

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
CPU_KV_CACHE_BYTES = 256 << 20
ENGINES = ("eager", "graphs")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each section measures."""

    copy_bytes: int
    copy_repeats: int
    decode_prompt: int
    decode_tokens: int
    decode_repeats: int
    step_prompt: int  # prompt length of the step profile's and the sweep's requests
    warmup_steps: int
    timed_steps: int
    profiled_steps: int
    profile_batches: tuple[int, ...]
    sweep_max_batch: int
    requests: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    hf_batch: int
    spec_prompts: int
    spec_tokens: int


FULL = Sizes(
    copy_bytes=2 << 30, copy_repeats=10,
    decode_prompt=32, decode_tokens=128, decode_repeats=3,
    step_prompt=128, warmup_steps=3, timed_steps=20, profiled_steps=10, profile_batches=(1, 64),
    sweep_max_batch=256,
    requests=256, prompt_lens=(100, 1024), output_lens=(100, 1024), hf_batch=64,
    spec_prompts=4, spec_tokens=96,
)  # fmt: skip
QUICK = Sizes(
    copy_bytes=64 << 20, copy_repeats=3,
    decode_prompt=8, decode_tokens=16, decode_repeats=2,
    step_prompt=16, warmup_steps=2, timed_steps=5, profiled_steps=3, profile_batches=(1, 4),
    sweep_max_batch=8,
    requests=16, prompt_lens=(8, 48), output_lens=(8, 48), hf_batch=8,
    spec_prompts=1, spec_tokens=16,
)  # fmt: skip


def label(kind: str, device: str) -> str:
    if kind == "hf":
        return "HF transformers generate"
    if kind == "eager":
        return "this engine, enforce_eager=True"
    return "this engine, enforce_eager=False" + (
        " (CUDA graphs)" if device.startswith("cuda") else " (no graphs on a CPU)"
    )


def measure_copy_bandwidth(device: str, nbytes: int, repeats: int) -> dict:
    """Bytes read + written per second by ``dst.copy_(src)`` on ``device`` (median of ``repeats``)."""
    sync = device_sync(device)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 2):  # two warm-ups: page faults, the copy kernel's first launch
        sync()
        start = time.perf_counter()
        dst.copy_(src)
        sync()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return {"bytes": nbytes, "repeats": repeats, "copy_GBps": 2 * nbytes / statistics.median(times) / 1e9}


class ShapeModels:
    """One shape's checkpoint folder and, built on first use, its engines ("eager", "graphs") and HF model."""

    def __init__(self, name: str, folder: Path, device: str, sizes: Sizes, max_num_seqs: int):
        self.name, self.folder, self.device, self.sizes, self.max_num_seqs = (
            name,
            folder,
            device,
            sizes,
            max_num_seqs,
        )
        self.dtype = EngineConfig(device=device).dtype
        self.built: dict = {}

    def write(self, section: Section) -> None:
        start = time.perf_counter()
        if self.name == "bundled":
            _, self.shape = write_bundled_checkpoint(self.folder)
        else:
            self.shape = SHAPES[self.name]
            write_random_checkpoint(self.shape, self.folder, self.device)
        s = self.sizes
        longest = max(
            sum(r[1] for r in (s.prompt_lens, s.output_lens)),
            s.decode_prompt + s.decode_tokens,
            s.step_prompt + s.warmup_steps + s.timed_steps + s.profiled_steps,
        )
        self.max_model_len = min(self.shape.max_position_embeddings, longest + 16)
        self.kv_cache_bytes = self._kv_cache_bytes()
        section.out.update(
            shape=self.name,
            source=self.shape.source,
            config=self.shape.hf_config(),
            weights="its Q4_1 weights dequantized to bfloat16"
            if self.name == "bundled"
            else "random bfloat16 weights",
            weight_bytes=self.shape.weight_bytes(),
            write_s=time.perf_counter() - start,
            dtype=self.dtype,
            kv_cache_bytes=self.kv_cache_bytes,
            max_model_len=self.max_model_len,
        )

    def _kv_cache_bytes(self) -> int:
        """On a GPU: what is left of 80% of its memory after three copies of the weights (two engines and HF)
        and HF's cache for one static batch, split between the two engines (2-40 GiB each)."""
        if not self.device.startswith("cuda"):
            return CPU_KV_CACHE_BYTES
        shape = self.shape
        total = torch.cuda.get_device_properties(torch.device(self.device)).total_memory
        hf_cache = (
            self.sizes.hf_batch
            * self.max_model_len
            * 2
            * shape.num_layers
            * shape.num_kv_heads
            * shape.head_dim
            * 2
        )
        each = (0.8 * total - 3 * shape.weight_bytes() - hf_cache) / 2
        return int(min(max(each, 2 << 30), 40 << 30))

    def llm(self, kind: str):
        if kind not in self.built:
            from ..llm import LLM

            self.built[kind] = LLM(
                model=str(self.folder),
                skip_tokenizer_init=True,
                device=self.device,
                max_num_seqs=self.max_num_seqs,
                max_model_len=self.max_model_len,
                kv_cache_memory=self.kv_cache_bytes,
                enforce_eager=kind == "eager",
            )
        return self.built[kind]

    def hf(self):
        if "hf" not in self.built:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging

            logging.set_verbosity_error()
            logging.disable_progress_bar()
            model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=getattr(torch, self.dtype))
            self.built["hf"] = model.to(self.device).eval()
        return self.built["hf"]

    def release(self, *kinds: str) -> None:
        for kind in kinds or list(self.built):
            self.built.pop(kind, None)
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def batches(self, wanted) -> list[int]:
        return [b for b in wanted if b <= self.max_num_seqs]


def _hf_generate(model, ids: torch.Tensor, mask: torch.Tensor, new_tokens: int, sync) -> None:
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    sync()


def measure_decode(models: ShapeModels, bandwidth_GBps: float | None, section: Section) -> None:
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    prompt = random_prompts(1, s.decode_prompt, models.shape.vocab_size, seed=1)[0]
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    runs = {}
    for kind in ENGINES:
        llm = models.llm(kind)
        runs[kind] = lambda n, llm=llm: (llm.generate([prompt], greedy(n), use_tqdm=False), sync())
    ids = torch.tensor([prompt], device=device)
    runs["hf"] = lambda n: _hf_generate(models.hf(), ids, torch.ones_like(ids), n, sync)
    speeds = decode_speeds(runs, s.decode_tokens, s.decode_repeats)
    weight_bytes = decode_bytes_per_token(models.llm("graphs").engine.model)
    roofline = bandwidth_GBps * 1e9 / weight_bytes if bandwidth_GBps else None
    section.out.update(
        prompt_tokens=s.decode_prompt,
        new_tokens=s.decode_tokens,
        repeats=s.decode_repeats,
        weight_bytes_per_token=weight_bytes,
        roofline_tok_s=roofline,
    )
    section.out["rows"] = [
        {
            "engine": kind,
            "label": label(kind, device),
            "tok_s": speed,
            "ms_per_token": 1e3 / speed,
            "roofline_share": speed / roofline if roofline else None,
        }
        for kind, speed in speeds.items()
    ]
    section.out["ratios"] = {
        "graphs_vs_eager": speeds["graphs"] / speeds["eager"],
        "graphs_vs_hf": speeds["graphs"] / speeds["hf"],
        "eager_vs_hf": speeds["eager"] / speeds["hf"],
    }


def _steady_steps(models: ShapeModels, kind: str, batch: int, profile: bool) -> dict:
    """One row of the step profile (``profile``) or the sweep: ``batch`` decodes prefilled, warm-up steps,
    then the median of timed steps (and the profiler's counts over more steps)."""
    s, sync = models.sizes, device_sync(models.device)
    engine = models.llm(kind).engine
    steps = s.warmup_steps + s.timed_steps + (s.profiled_steps if profile else 0)
    ids = start_decodes(engine, batch, s.step_prompt, max_tokens=steps + 2, seed=batch)
    decode_step_times(engine, s.warmup_steps, batch, sync)
    step_ms = median_ms(decode_step_times(engine, s.timed_steps, batch, sync))
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
        prompt_tokens=s.step_prompt,
        timed_steps=s.timed_steps,
        profiled_steps=s.profiled_steps,
        on_cuda=models.device.startswith("cuda"),
        rows=[],
    )
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


def nano_vllm_workload(sizes: Sizes, vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): random token ids below min(10,000, vocab), lengths uniform in the ranges."""
    rng = random.Random(seed)
    top = min(10_000, vocab_size)
    prompts = [
        [rng.randrange(top) for _ in range(rng.randint(*sizes.prompt_lens))] for _ in range(sizes.requests)
    ]
    return prompts, [rng.randint(*sizes.output_lens) for _ in range(sizes.requests)]


def measure_throughput(models: ShapeModels, section: Section) -> None:
    s, device, sync = models.sizes, models.device, device_sync(models.device)
    prompts, output_lens = nano_vllm_workload(s, models.shape.vocab_size)
    lo_in, hi_in = s.prompt_lens
    lo_out, hi_out = s.output_lens
    section.out["workload"] = {
        "description": f"nano-vllm's workload: random token ids, prompt lengths uniform in [{lo_in}, "
        f"{hi_in}], output lengths uniform in [{lo_out}, {hi_out}] (seed 0), greedy, EOS ignored",
        "requests": len(prompts),
        "prompt_tokens": sum(map(len, prompts)),
        "output_tokens": sum(output_lens),
    }
    rows = section.out["rows"] = []
    models.release("eager")  # room for HF's static batches
    llm = models.llm("graphs")
    warm_up = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    llm.generate(random_prompts(2, 16, models.shape.vocab_size, seed=7), warm_up, use_tqdm=False)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in output_lens]
    sync()
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    wall = time.perf_counter() - start
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    if produced != sum(output_lens):
        raise RuntimeError(f"the engine produced {produced} tokens, the workload asks for {sum(output_lens)}")
    rows.append(
        {
            "engine": "graphs",
            "label": label("graphs", device) + f", max_num_seqs={models.max_num_seqs}",
            "requests": len(prompts),
            "output_tokens": produced,
            "wall_s": wall,
            "output_tok_s": produced / wall,
        }
    )
    hf = models.hf()
    warm_ids = torch.ones(2, 4, dtype=torch.long, device=device)
    _hf_generate(hf, warm_ids, torch.ones_like(warm_ids), 2, sync)
    done, useful, wall, last = 0, 0, 0.0, 0.0
    while done < len(prompts) and (done == 0 or section.seconds_left() > 1.5 * last):
        batch, wanted = prompts[done : done + s.hf_batch], output_lens[done : done + s.hf_batch]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)  # left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        start = time.perf_counter()
        _hf_generate(hf, ids, mask, max(wanted), sync)  # the batch holds every slot until its longest is done
        last = time.perf_counter() - start
        done, useful, wall = done + len(batch), useful + sum(wanted), wall + last
    batches = -(-len(prompts) // s.hf_batch)
    rows.append(
        {
            "engine": "hf",
            "label": f"HF generate, static batches of {s.hf_batch} in arrival order (left-padded, "
            f"unsorted): the first {-(-done // s.hf_batch)} of {batches}",
            "requests": done,
            "output_tokens": useful,
            "wall_s": wall,
            "output_tok_s": useful / wall,
        }
    )
    section.out["ratio_vs_hf"] = rows[0]["output_tok_s"] / rows[1]["output_tok_s"]


def measure_speculative(device: str, sizes: Sizes, section: Section) -> None:
    """Plain (the engine's default), n-gram and EAGLE chain decoding of held-back prompts, bundled model."""
    from ..llm import LLM
    from ..model import loader
    from ..speculative.eagle import DATA_DIR

    try:
        loader.bundled_model_path()
    except FileNotFoundError as missing:
        raise SectionSkipped(
            f"the EAGLE and n-gram rows need the bundled model ({loader.INSTALL_HINT})"
        ) from missing
    held_back = [json.loads(line)["prompt"] for line in (DATA_DIR / "heldout.jsonl").read_text().splitlines()]
    methods = {
        "plain": {},
        "n-gram k=3": dict(speculative="ngram", num_speculative_tokens=3),
        "EAGLE chain k=3": dict(speculative="eagle", num_speculative_tokens=3),
    }
    engines = {
        name: LLM(
            device=device, max_num_seqs=1, max_model_len=1024, kv_cache_memory=CPU_KV_CACHE_BYTES, **opts
        )
        for name, opts in methods.items()
    }
    sync, tokenizer = device_sync(device), engines["plain"].tokenizer
    params = SamplingParams(temperature=0, max_tokens=sizes.spec_tokens, ignore_eos=True)
    totals = {
        name: {"seconds": 0.0, "tokens": 0, "passes": 0, "verified": 0, "differ": 0} for name in methods
    }
    for llm in engines.values():
        llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    for text in held_back[: sizes.spec_prompts]:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}])
        outputs = {}
        for name, llm in engines.items():
            sync()
            start = time.perf_counter()
            out = llm.generate(prompt, params, use_tqdm=False)[0]
            sync()
            t = totals[name]
            t["seconds"] += time.perf_counter() - start
            t["tokens"] += len(out.outputs[0].token_ids)
            t["passes"] += out.metrics.num_verify_passes
            t["verified"] += out.metrics.num_verified_tokens
            outputs[name] = out.outputs[0].token_ids
        for name in methods:
            totals[name]["differ"] += outputs[name] != outputs["plain"]
    plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
    section.out.update(
        model=f"bundled {loader.BUNDLED_FILE}, {engines['plain'].engine.config.dtype}",
        prompts=min(sizes.spec_prompts, len(held_back)),
        max_tokens=sizes.spec_tokens,
    )
    section.out["rows"] = [
        {
            "method": name,
            "enforce_eager": engines[name].engine.config.enforce_eager,
            "tok_s": t["tokens"] / t["seconds"],
            "speedup": t["tokens"] / t["seconds"] / plain,
            "tau": t["verified"] / t["passes"] if t["passes"] else 1.0,
            "outputs_differing": t["differ"],
        }
        for name, t in totals.items()
    ]


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions bench gpu", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--shapes",
        "--shape",
        nargs="+",
        default=None,
        metavar="SHAPE",
        help=f"any of {', '.join([*SHAPES, 'bundled'])} (default on CUDA: "
        f"{' '.join(DEFAULT_SHAPES)}; on a CPU: tiny)",
    )
    parser.add_argument(
        "--sections",
        nargs="+",
        default=list(SECTIONS),
        choices=SECTIONS,
        metavar="SECTION",
        help=f"any of {', '.join(SECTIONS)} (default: all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes everywhere: a smoke test, not a measurement"
    )
    parser.add_argument("--device", default="auto", help="cuda, cuda:N or cpu (default: cuda when present)")
    parser.add_argument(
        "--max-num-seqs", type=int, default=256, help="the engines' max_num_seqs; caps the sweep"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="throughput requests (default 256; --quick 16)"
    )
    parser.add_argument(
        "--hf-batch", type=int, default=None, help="HF static batch size (default 64; --quick 8)"
    )
    parser.add_argument(
        "--time-limit", type=float, default=470, help="seconds; later sections are skipped past it"
    )
    parser.add_argument(
        "--out", default="results", help="folder for the JSON and markdown (default: results)"
    )
    parser.add_argument(
        "--commit", default=None, help="the commit measured (default: git describe, when in git)"
    )
    args = parser.parse_args(argv)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: torch sees no CUDA GPU")
    shapes = args.shapes or (list(DEFAULT_SHAPES) if device.startswith("cuda") else ["tiny"])
    unknown = [s for s in shapes if s not in SHAPES and s != "bundled"]
    if unknown:
        parser.error(f"unknown shape(s) {', '.join(unknown)}: choose from {', '.join([*SHAPES, 'bundled'])}")
    if args.max_num_seqs < 1 or (args.requests or 1) < 1 or (args.hf_batch or 1) < 1:
        parser.error("--max-num-seqs, --requests and --hf-batch must be positive")
    sizes = QUICK if args.quick else FULL
    sizes = dataclasses.replace(
        sizes, requests=args.requests or sizes.requests, hf_batch=args.hf_batch or sizes.hf_batch
    )
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
            measure_copy_bandwidth(device, sizes.copy_bytes, sizes.copy_repeats)
        )
        report.section(report.data, "bandwidth", BUDGET_S["bandwidth"], copy)
    for name in shapes if set(args.sections) & {"decode", "profile", "sweep", "throughput"} else []:
        bench_shape(report, name, device, sizes, args.sections, args.max_num_seqs)
    if "spec" in args.sections:
        report.section(
            report.data, "speculative", BUDGET_S["spec"], lambda sec: measure_speculative(device, sizes, sec)
        )
    sections = [report.data.get("bandwidth"), report.data.get("speculative")]
    sections += [s for shape in report.data.get("shapes", {}).values() for s in shape.values()]
    failed = [s for s in sections if s and s["status"] in ("failed", "timed out")]
    print(f"wrote {report.json_path} and {report.md_path}; {len(failed)} section(s) failed or timed out")
    return 1 if failed else 0
