"""``python -m solutions bench host``: what the engine itself costs per decode step, the model taken out.

On a GPU a decode step is host work (scheduling, the persistent input batch, launching the graph and the
sampler, reading the sampled ids, stop checks, outputs) followed by device work; with the forward replayed
from a CUDA graph, the host part is what keeps the GPU idle between steps (in the eager baseline profile on
an H200, each request beyond the first added about 86 us to a step). Here the decode graph is a
``StoredLogits``: captured like a graph, its replay returns the logits of its capture at no cost, so a timed
step is the host part alone, on any machine. The model is the toy shape (its small vocabulary keeps the
sampler's argmax, device work on a GPU, out of the figures). Printed per batch size and output kind
("final": only finished requests report, as ``LLM.generate``; "cumulative": every step, whole, as
``LLM.stream``; "delta": every step, only what it added, as the server streams), at a few points of the
outputs' length, with each streamed kind's cost beside "final"'s.

Overlap scheduling (``async_scheduling``) hides host work behind the device's: ``--device-us D`` gives the
stored-logits graph a simulated device (``SimulatedStream``: a replay keeps it busy ``D`` microseconds after
whatever it was already running, and the read of the draws waits for it, as a CUDA event would), and prints
each batch's step time with synchronous and with overlapped scheduling, and the host time each leaves exposed
(the step's time beyond ``D``): synchronous steps expose all of it, overlapped ones only what exceeds ``D``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from ...bench.kv import kv_bytes_per_token
from ...bench.machine import machine_name
from ...bench.model_shapes import SHAPES, ModelShape, write_random_checkpoint
from ...engine.cuda_graphs import RecordedCall
from ...engine.outputs import OutputKind
from ...llm import LLM
from ...sampling_params import SamplingParams
from . import bench_parser

KINDS = ("final", "cumulative", "delta")
PROMPT_TOKENS = 3


class StoredLogits(RecordedCall):
    """A decode "graph" whose replay returns the logits its capture computed: a step without the model."""

    def replay(self) -> tuple[torch.Tensor, ...]:
        return self.outputs


class SimulatedStream:
    """A device that runs one queued step at a time: ``run(seconds)`` queues work behind what it already
    has; an ``Event`` recorded after it waits, in ``synchronize``, until the device gets there."""

    def __init__(self):
        self.busy_until = 0.0

    def run(self, seconds: float) -> None:
        self.busy_until = max(time.perf_counter(), self.busy_until) + seconds

    def event(self) -> SimulatedStream.Event:
        return SimulatedStream.Event(self)

    class Event:
        def __init__(self, stream: SimulatedStream):
            self.stream, self.at = stream, 0.0

        def record(self) -> None:
            self.at = self.stream.busy_until

        def synchronize(self) -> None:
            while time.perf_counter() < self.at:
                pass


def simulate_device(engine, device_s: float) -> None:
    """Make each graph replay keep a ``SimulatedStream`` busy ``device_s`` and the step's read wait for it."""
    stream, runner = SimulatedStream(), engine.runner
    replay = runner.graphs.replay
    runner.graphs.replay = lambda bucket: stream.run(device_s) or replay(bucket)
    runner._tokens_ready = [stream.event(), stream.event()]


def measure_host_steps(
    folder: Path,
    shape: ModelShape,
    batch: int,
    output_kind: OutputKind,
    marks: list[int],
    steps: int,
    device_us: float | None = None,
    overlap: bool = False,
) -> list[float]:
    """``batch`` greedy requests of the model in ``folder`` (of ``shape``) decoding from a ``StoredLogits``
    graph; at each of ``marks`` (tokens out, ascending) the mean time of the next ``steps`` steps, in
    microseconds: the host's alone, or with ``device_us`` a simulated device step's and the host's as
    synchronous (or, ``overlap``, overlapped) scheduling combines them."""
    longest = marks[-1] + steps + 1
    max_model_len = PROMPT_TOKENS + longest + 1
    token_bytes = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, 4)  # float32
    llm = LLM(
        model=str(folder), device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=batch,
        max_model_len=max_model_len, max_num_batched_tokens=max(512, batch * PROMPT_TOKENS),
        kv_cache_memory=(batch + 1) * (max_model_len + 16) * token_bytes, async_scheduling=overlap,
    )  # fmt: skip
    engine = llm.engine
    engine.runner.capture_decode_graphs(batch, StoredLogits)
    if device_us is not None:
        simulate_device(engine, device_us * 1e-6)
    params = SamplingParams(temperature=0, max_tokens=longest, ignore_eos=True)
    prompts = [[1 + i % 100, 2, 3] for i in range(batch)]
    ids = engine.add_requests(prompts, [params] * batch, output_kind=output_kind)
    engine.step()  # the prefill: one token out
    results, done = [], 1
    for mark in marks:
        while done < mark:
            engine.step()
            done += 1
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        results.append(1e6 * (time.perf_counter() - start) / steps)
        done += steps
    engine.abort(ids)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.split("\n")[0])
    add = parser.add_argument
    add("--batches", type=int, nargs="+", default=[1, 8, 64, 256],
        help="requests per step (default: 1 8 64 256)")  # fmt: skip
    add("--marks", type=int, nargs="+", default=[100, 900],
        help="tokens out at which steps are timed (default: 100 900)")  # fmt: skip
    add("--steps", type=int, default=50, help="steps timed at each mark (default: 50)")
    add("--device-us", type=float, default=None,
        help="also time synchronous against overlapped scheduling with a simulated device step of this "
        "many microseconds")  # fmt: skip
    args = parser.parse_args(argv)
    marks = sorted(args.marks)
    if marks[0] < 1 or args.steps < 1 or min(args.batches) < 1:
        parser.error("--marks, --steps and --batches must be at least 1")
    if args.device_us is not None and args.device_us <= 0:
        parser.error(f"--device-us must be > 0, got {args.device_us}")
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
        if args.device_us is not None:
            print_overlap(folder, shape, args.batches, marks[:1], args.steps, args.device_us)
    return 0


def print_overlap(
    folder: Path, shape: ModelShape, batches: list[int], marks: list[int], steps: int, device_us: float
) -> None:
    """Each batch's step with a simulated device step of ``device_us``: synchronous and overlapped scheduling
    (output kind "final"), and the host time each leaves exposed beside the device's."""
    print(f"\nOverlap scheduling, a simulated device step of {device_us:.0f} us (output kind final):\n")
    header = (
        f"{'batch':>6}{'sync us/step':>16}{'overlap us/step':>18}{'exposed sync':>16}{'exposed overlap':>18}"
    )
    print(header)
    print("-" * len(header))
    for batch in batches:
        sync, overlap = (
            measure_host_steps(folder, shape, batch, "final", marks, steps, device_us, overlapped)[0]
            for overlapped in (False, True)
        )
        print(
            f"{batch:>6}{sync:>16.0f}{overlap:>18.0f}"
            f"{max(sync - device_us, 0):>16.0f}{max(overlap - device_us, 0):>18.0f}"
        )
