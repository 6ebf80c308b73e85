"""The GPU measurements committed under ``results/``, read for the notebooks (which run on CPUs).

Two kinds of run: the first baseline (``results/h200-2026-12-04-baseline/``: ``probe.json``, the step
profiles and the benchmark printouts, with ``run.json`` naming the GPU, date, commit and commands), and the
runs of ``python -m solutions bench gpu`` (``results/**/gpu_*.json``, each with its own header). Every figure
a notebook prints from here goes out with its run's ``label``: the GPU, the date, the commit, the command.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..paths import REPO_DIR
from .frontier import FrontierPoint

RESULTS_DIR = REPO_DIR / "results"
BASELINE_DIR = RESULTS_DIR / "h200-2026-12-04-baseline"


@dataclass(frozen=True)
class GpuRun:
    """One run: the machine (a GPU's name; a CPU's for a ``bench gpu`` smoke run on ``device`` "cpu"), when it
    ran, the commit and command, and its JSON document."""

    gpu: str
    device: str
    date: str
    commit: str
    command: str
    path: Path
    data: dict

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def label(self) -> str:
        return f"{self.gpu}, {self.date}, commit {self.commit}: {self.command}"


@dataclass(frozen=True)
class StepTime:
    """One profiled decode step: ``batch`` sequences decoding together."""

    model: str
    batch: int
    wall_ms: float
    gpu_busy_ms: float


def load_baseline(folder: Path = BASELINE_DIR) -> GpuRun:
    """The first H200 run: ``probe.json`` as ``data``, labelled from ``run.json``."""
    meta = json.loads((folder / "run.json").read_text())
    return GpuRun(
        gpu=meta["gpu"],
        device="cuda",
        date=meta["date"],
        commit=meta["commit"],
        command=meta["commands"]["probe.json"],
        path=folder / "probe.json",
        data=json.loads((folder / "probe.json").read_text()),
    )


PROFILE_FILES = {
    "SmolLM2-135M (bf16)": "profile_135m.txt",
    "1.7B shape (bf16, random weights)": "profile_1.7b_shape.txt",
}
_STEP_LINE = re.compile(r"^### \S+ batch (\d+): wall ([\d.]+) ms/step; GPU busy ([\d.]+) ms/step")


def baseline_decode_steps(folder: Path = BASELINE_DIR) -> list[StepTime]:
    """The profiles' steady decode steps. The runs asked for batches of 1 and 64 with ``max_num_seqs`` at its
    default (``run.json``), so the larger one decoded ``max_num_seqs`` sequences a step: the batch given."""
    cap = json.loads((folder / "run.json").read_text())["max_num_seqs"]
    steps = []
    for model, name in PROFILE_FILES.items():
        for line in (folder / name).read_text().splitlines():
            if match := _STEP_LINE.match(line):
                batch, wall, busy = int(match[1]), float(match[2]), float(match[3])
                steps.append(StepTime(model, min(batch, cap), wall, busy))
    return steps


def frontier_from_steps(steps: list[StepTime]) -> dict[str, list[FrontierPoint]]:
    """Per model, the frontier of steady decoding: a token a step for each user, ``batch`` for the machine."""
    frontier: dict[str, list[FrontierPoint]] = {}
    for s in steps:
        frontier.setdefault(s.model, []).append(
            FrontierPoint(s.batch, 1e3 / s.wall_ms, s.batch * 1e3 / s.wall_ms)
        )
    return {model: sorted(points, key=lambda p: p.batch) for model, points in frontier.items()}


@dataclass(frozen=True)
class AttentionRow:
    """One row of ``bench attention``'s CUDA table: TFLOP/s of our kernel, SDPA and naive attention (None: the
    naive N x N scores did not fit)."""

    dtype: str
    head_dim: int
    causal: bool
    seq_len: int
    ours_tflops: float
    sdpa_tflops: float
    naive_tflops: float | None


def baseline_attention(folder: Path = BASELINE_DIR) -> list[AttentionRow]:
    """The "Attention forward on <GPU>" table of ``bench_attention.txt``."""
    lines = (folder / "bench_attention.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Attention forward on"))
    rows = []
    for line in lines[start + 2 :]:
        parts = line.split()
        if len(parts) != 8:
            break
        dtype, head_dim, causal, n, ours, sdpa, naive, _ = parts
        naive_tflops = None if naive == "nan" else float(naive)
        rows.append(
            AttentionRow(
                dtype, int(head_dim), causal == "True", int(n), float(ours), float(sdpa), naive_tflops
            )
        )
    return rows


@dataclass(frozen=True)
class MoeRow:
    """One shape of ``bench moe``'s GPU table: milliseconds of the grouped Triton kernel (the engine's path),
    Hugging Face's per-expert loop and the dense FFN of the same active size."""

    hidden: int
    width: int
    grouped_ms: float
    loop_ms: float
    dense_ms: float


def baseline_moe(folder: Path = BASELINE_DIR) -> list[MoeRow]:
    """The "GPU (<name>)" table of ``bench_moe.txt``, one row per (H, I) shape."""
    lines = (folder / "bench_moe.txt").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("GPU ("))
    times: dict[tuple[int, int], dict[str, float]] = {}
    for line in lines[start + 2 :]:
        parts = re.split(r"\s{2,}", line.strip())  # "4096 x 14336", "grouped (engine path)", "8.183", ...
        if len(parts) < 5 or " x " not in parts[0]:
            break
        hidden, width = (int(v) for v in parts[0].split(" x "))
        impl = next(name for name in ("grouped", "per-expert loop", "dense FFN") if parts[1].startswith(name))
        times.setdefault((hidden, width), {})[impl] = float(parts[2])
    return [
        MoeRow(hidden, width, t["grouped"], t["per-expert loop"], t["dense FFN"])
        for (hidden, width), t in times.items()
    ]


def bench_gpu_runs(root: Path = RESULTS_DIR) -> list[GpuRun]:
    """Every ``python -m solutions bench gpu`` document under ``root`` (``gpu_*.json`` with a ``header``),
    newest first (by the header's date, then the file name: later runs of a day end in ``-2``, ``-3``...)."""
    runs = []
    for path in root.rglob("gpu_*.json"):
        data = json.loads(path.read_text())
        header = data.get("header") if isinstance(data, dict) else None
        if not header:
            continue
        runs.append(
            GpuRun(
                header["machine"],
                header["device"],
                header["date"],
                header["commit"],
                header["command"],
                path,
                data,
            )
        )
    return sorted(runs, key=lambda r: (r.date, _run_number(r.path)), reverse=True)


def _run_number(path: Path) -> int:
    match = re.search(r"_\d{4}-\d{2}-\d{2}-(\d+)$", path.stem)  # gpu_<machine>_<date>-N: the day's run N
    return int(match[1]) if match else 1


def bench_gpu_frontier(run: GpuRun, engine: str = "graphs") -> dict[str, list[FrontierPoint]]:
    """Per shape, the steady-decode batch sweep of ``engine`` ("graphs": the engine's default; "eager") from a
    ``bench gpu`` run; shapes whose sweep did not finish are left out."""
    frontier = {}
    for shape, sections in run.data.get("shapes", {}).items():
        sweep = sections.get("sweep", {})
        rows = [r for r in sweep.get("rows", []) if r["engine"] == engine]
        if sweep.get("status") == "ok" and rows:
            frontier[shape] = [
                FrontierPoint(r["batch"], r["per_request_tok_s"], r["aggregate_tok_s"]) for r in rows
            ]
    return frontier


def finished_section(run: GpuRun, key: str, shape: str | None = None) -> dict | None:
    """A ``bench gpu`` run's section (``run.data[key]``, or ``run.data["shapes"][shape][key]``) if it finished
    ("status": "ok"), else None."""
    parent = run.data.get("shapes", {}).get(shape, {}) if shape else run.data
    section = parent.get(key)
    return section if isinstance(section, dict) and section.get("status") == "ok" else None
