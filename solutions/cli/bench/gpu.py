"""``python -m solutions bench gpu``: the engine on a GPU in one run, every figure beside its peers.

For each named shape (a real model's config with random bfloat16 weights, see ``model_shapes``) it measures:

- decode: batch-1 decode tok/s of this engine eager (``enforce_eager=True``), this engine with its default
  (CUDA graphs where the engine has them), on CUDA the same with INT4 weights (W4A16: RTN codes in AWQ's
  format, which time as AWQ's do) and Hugging Face ``generate`` on the same folder, against the roofline
  (weight bytes per token over the measured copy bandwidth);
- profile: one decode step's wall time vs GPU busy time, kernels, host syncs and copies (``torch.profiler``);
- sweep: steady-state decode at batch 1, 2, 4, ... max_num_seqs: per-request and aggregate tok/s;
- throughput: nano-vllm's workload (``benchmarks/bench.py`` there: 256 requests, random token ids below
  10,000, prompt and output lengths uniform in [100, 1024], EOS ignored), greedy, this engine vs HF static
  batches;

then EAGLE chain and n-gram speculative decoding at batch 1 on the bundled model, when it is installed.
Sections are guarded and time-boxed; the JSON and markdown under ``--out`` are rewritten after each one.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

import torch

from ...bench.gpu import BUDGET_S, DEFAULT_SHAPES, SECTIONS, bench_shape
from ...bench.gpu_report import Report, run_header
from ...bench.gpu_setup import FULL, QUICK
from ...bench.gpu_speculative import measure_speculative
from ...bench.model_shapes import SHAPES
from ...bench.timing import bandwidth_gbps, timer_name
from . import bench_parser


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
            bytes=sizes.copy_bytes,
            timer=timer_name(device, sizes.copy_repeats),
            copy_GBps=bandwidth_gbps(sizes.copy_bytes, device, repeats=sizes.copy_repeats),
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
