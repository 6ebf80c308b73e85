"""``python -m solutions bench host``: what the engine itself costs per decode step, the model taken out.

A step's forward replays a decode graph whose logits were stored at capture (``bench/host_step.py``), so the
time left is the host's: scheduling, the persistent input batch, the sampler, the one read of the sampled ids,
stop checks and the outputs. On a GPU this is the time the device waits between steps (in the eager baseline
profile on an H200, each request beyond the first added about 86 us to a step). Printed per batch size
and output kind ("final": only finished requests report, as ``LLM.generate``; "cumulative": every step,
whole, as ``LLM.stream``; "delta": every step, only what it added, as the server streams), at a few points
of the outputs' length, with each streamed kind's cost beside "final"'s.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ...bench.host_step import measure_host_steps
from ...bench.machine import machine_name
from ...bench.model_shapes import SHAPES, write_random_checkpoint
from . import bench_parser

KINDS = ("final", "cumulative", "delta")


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.split("\n")[0])
    parser.add_argument(
        "--batches", type=int, nargs="+", default=[1, 8, 64, 256],
        help="requests per step (default: 1 8 64 256)",
    )  # fmt: skip
    parser.add_argument(
        "--marks", type=int, nargs="+", default=[100, 900],
        help="tokens out at which steps are timed (default: 100 900)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=50, help="steps timed at each mark (default: 50)")
    args = parser.parse_args(argv)
    marks = sorted(args.marks)
    if marks[0] < 1 or args.steps < 1 or min(args.batches) < 1:
        parser.error("--marks, --steps and --batches must be at least 1")
    shape = SHAPES["tiny"]
    print(f"Host time per decode step on {machine_name('cpu')}: the model replaced by stored logits")
    print(f"({shape.name} shape, vocabulary {shape.vocab_size}; mean of {args.steps} steps at each point).\n")
    header = f"{'batch':>6}{'tokens out':>12}" + "".join(f"{k + ' us/step':>20}" for k in KINDS)
    header += "".join(f"{k + ' +us/request':>24}" for k in KINDS[1:])
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_random_checkpoint(shape, Path(tmp) / shape.name)
        measure_host_steps(folder, shape, 1, "final", [2], 20)  # a warm-up: a process's first steps are slow
        for batch in args.batches:
            runs = {kind: measure_host_steps(folder, shape, batch, kind, marks, args.steps) for kind in KINDS}
            for i, mark in enumerate(marks):
                us = {kind: runs[kind][i] for kind in KINDS}
                line = f"{batch:>6}{mark:>12}" + "".join(f"{us[k]:>20.0f}" for k in KINDS)
                line += "".join(f"{(us[k] - us['final']) / batch:>24.1f}" for k in KINDS[1:])
                print(line)
    return 0
