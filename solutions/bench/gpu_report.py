"""The record of one ``bench gpu`` run: guarded, time-boxed sections that fill a JSON document, written (with
its markdown tables) after every section, so a run cut short still leaves what it measured.

    report.data = {"header": {...}, "bandwidth": {...}, "shapes": {name: {"model", "engines", "decode",
                   "profile", "sweep", "throughput"}}, "speculative": {...}}

Every section's dict starts with ``status`` ("ok", "failed", "timed out", "skipped"; "running" in a file
written mid-section) and ``seconds``; a failed one carries ``error``, a skipped one ``reason``, and both keep
what was measured before they stopped.
"""

from __future__ import annotations

import json
import platform
import re
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import NoReturn

import torch

from .machine import machine_name

MIN_SECTION_S = 10.0  # a section that would get less than this before the run's deadline is skipped instead


class SectionTimeout(TimeoutError):
    """Raised (by SIGALRM) inside a section that ran past its time budget."""


class SectionSkipped(Exception):
    """Raised by a section that cannot run here; its message is the reason the report gives."""


def git_commit() -> str:
    repo = Path(__file__).resolve().parents[2]
    try:
        describe = ["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=12"]
        done = subprocess.run(describe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git here: pass --commit)"
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout: pass --commit)"


def run_header(device: str, command: str, commit: str | None, preset: str, time_limit_s: float) -> dict:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "machine": machine_name(device), "device": device, "date": date, "command": command,
        "commit": commit or git_commit(), "torch": torch.__version__, "triton": triton_version,
        "transformers": transformers.__version__, "python": platform.python_version(), "preset": preset,
        "time_limit_s": time_limit_s,
    }  # fmt: skip


class Section:
    """What a running section fills (``out``) and when its time is up (``ends_at``, ``time.monotonic()``).
    ``save()`` writes what it holds so far (status "running"): a section calls it the moment a row exists, so
    a run killed from outside still leaves every row measured."""

    def __init__(self, ends_at: float, save: Callable[[], None] = lambda: None):
        self.out: dict = {}
        self.ends_at = ends_at
        self.save = save

    def seconds_left(self) -> float:
        return self.ends_at - time.monotonic()


class Report:
    """Holds the run's document; ``save`` writes ``<stem>.json`` and ``<stem>.md`` into ``out_dir``, the stem
    naming the machine and the date (``gpu_nvidia-h200_2026-12-05``; ``-2``, ``-3``... for later runs)."""

    def __init__(self, out_dir: Path, header: dict, time_limit_s: float):
        self.data: dict = {"header": header}
        self.deadline = time.monotonic() + time_limit_s
        slug = re.sub(r"[^a-z0-9]+", "-", header["machine"].split(" (CPU")[0].lower()).strip("-")
        stem = f"gpu_{slug}_{header['date'][:10]}"
        out_dir.mkdir(parents=True, exist_ok=True)
        self.json_path = out_dir / f"{stem}.json"
        for n in range(2, 1000):
            if not self.json_path.exists():
                break
            self.json_path = out_dir / f"{stem}-{n}.json"
        self.md_path = self.json_path.with_suffix(".md")
        self.save()

    def save(self) -> None:
        self.json_path.write_text(json.dumps(self.data, indent=1) + "\n")
        self.md_path.write_text(_never_raising(render, self.data))

    def section(
        self,
        parent: dict,
        key: str,
        budget_s: float,
        measure: Callable[[Section], None],
        reserve_s: float = 0.0,
    ) -> bool:
        """Run ``measure`` into ``parent[key]`` within ``budget_s`` and the run's deadline less ``reserve_s``
        (kept for sections still to come), catch whatever it raises, save, and print the section's tables.
        True when it finished."""
        left = self.deadline - reserve_s - time.monotonic()
        if left < MIN_SECTION_S:
            parent[key] = {"status": "skipped", "seconds": 0.0, "reason": "the run's time limit was reached"}
        else:
            budget = min(budget_s, left)
            start = time.monotonic()

            def save_so_far() -> None:
                elapsed = round(time.monotonic() - start, 1)
                parent[key] = {"status": "running", "seconds": elapsed, **section.out}
                self.save()

            section = Section(start + budget, save_so_far)
            status, detail = "ok", {}
            try:
                with _alarm(budget):
                    measure(section)
            except SectionTimeout:
                status, detail = "timed out", {"error": f"over its {budget:.0f} s budget"}
            except SectionSkipped as reason:
                status, detail = "skipped", {"reason": str(reason)}
            except Exception as error:  # noqa: BLE001 -- one failing section must not stop the others
                traceback.print_exc()
                status, detail = "failed", {"error": f"{type(error).__name__}: {error}"[:2000]}
            seconds = round(time.monotonic() - start, 1)
            parent[key] = {"status": status, "seconds": seconds, **detail, **section.out}
        self.save()
        print(_never_raising(render_section, key, parent[key]), flush=True)
        return parent[key]["status"] == "ok"


def _never_raising(render_function: Callable[..., str], *args) -> str:
    """The markdown, or a line saying why it could not be made: the JSON, written first, must outlive a
    section that stopped before filling what its table needs."""
    try:
        return render_function(*args)
    except (KeyError, TypeError, ValueError) as error:
        return f"(markdown not rendered: {type(error).__name__}: {error}; the JSON holds the measurements)\n"


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raise SectionTimeout in this (main) thread after ``seconds``. Signals reach only the main thread;
    elsewhere only the run's deadline, checked between sections, applies."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: FrameType | None) -> NoReturn:
        raise SectionTimeout

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# The markdown: one block per section, the run in order.
SHAPE_SECTIONS = ("model", "engines", "decode", "profile", "sweep", "throughput")


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _share(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def render(data: dict) -> str:
    h = data["header"]
    lines = [
        f"# `bench gpu` on {h['machine']}, {h['date']}",
        "",
        f"command: `{h['command']}`  ",
        f"commit {h['commit']}; torch {h['torch']}, triton {h['triton']}, transformers {h['transformers']}, "
        f"Python {h['python']}; device {h['device']}; preset {h['preset']}, "
        f"time limit {h['time_limit_s']:.0f} s",
        "",
    ]
    if "bandwidth" in data:
        lines.append(render_section("bandwidth", data["bandwidth"]))
    for sections in data.get("shapes", {}).values():
        lines += [render_section(key, sections[key]) for key in SHAPE_SECTIONS if key in sections]
    if "speculative" in data:
        lines.append(render_section("speculative", data["speculative"]))
    return "\n".join(lines) + "\n"


def render_section(key: str, s: dict) -> str:
    heading, needs, body = SECTION_TABLES[key]
    lines = [f"## {s.get('shape', '?')}", ""] if key == "model" else [heading, ""] if heading else []
    if needs in s:
        lines += body(s)
    if s["status"] != "ok":
        why = s.get("error") or s.get("reason", "")
        lines.append(f"*{key}: {s['status']} after {s['seconds']} s: {why}*")
    return "\n".join(lines) + "\n"


def _bandwidth(s: dict) -> list[str]:
    return [
        f"Copy bandwidth: {_num(s['copy_GBps'], 0)} GB/s (device-to-device copy of a "
        f"{s['bytes'] / 2**30:.2f} GiB buffer, bytes read + written, {s['timer']})"
    ]


def _model(s: dict) -> list[str]:
    c = s["config"]
    return [
        f"{s['source']}: hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
        f"{c['num_attention_heads']} heads / {c['num_key_value_heads']} KV heads, intermediate "
        f"{c['intermediate_size']}, vocab {c['vocab_size']}, "
        f"{'tied' if c['tie_word_embeddings'] else 'untied'} head, RoPE theta {c['rope_theta']:g}"
        f"{' (llama3 scaling)' if c.get('rope_scaling') else ''}; {s['weights']}, "
        f"{s['weight_bytes'] / 1e9:.2f} GB, written in {s['write_s']:.1f} s. Engines run {s['dtype']} "
        f"with {s['kv_cache_bytes'] / 2**30:.1f} GiB of KV cache each, "
        f"max_model_len {s['max_model_len']}."
    ]


def _engines(s: dict) -> list[str]:
    caption = (
        "Start-up, before any timed region: each engine built (weights loaded), its decode kernel tuned for "
        "every call a step can make, its decode graphs captured (largest first, into one pool); seconds, "
        "and the device memory the graphs added."
    )
    graph_mib = lambda r: None if not r.get("captures") else sum(c["MiB"] or 0 for c in r["captures"])
    table = _columns(s["rows"], {
        "engine": lambda r: r["engine"], "build s": lambda r: _num(r["build_s"]),
        "tuning s": lambda r: _num(r.get("tune_s")),
        "tuned calls": lambda r: str(r.get("tuned_calls", "-")),
        "graphs": lambda r: str(len(r.get("captures") or [])),
        "capture s": lambda r: _num(r.get("capture_s")),
        "graph MiB": lambda r: _num(graph_mib(r), 0),
    })  # fmt: skip
    return [caption, "", *table]


def _columns(records: list[dict], columns: dict[str, Callable[[dict], str]]) -> list[str]:
    """A markdown table of one row per record, each column's cell ``columns[name](record)`` (the first column
    left-aligned, the others right)."""
    aligns = ["---"] + ["---:"] * (len(columns) - 1)
    cells = [[cell(r) for cell in columns.values()] for r in records]
    return [f"| {' | '.join(row)} |" for row in [list(columns), aligns, *cells]]


def _decode(s: dict) -> list[str]:
    caption = (
        f"Prompt {s['prompt_tokens']} tokens, (t({s['new_tokens']} tokens) - t(1 token)) / "
        f"{s['new_tokens'] - 1}, median of {s['repeats']}, engines alternating. Roofline: "
        f"{s['weight_bytes_per_token'] / 1e9:.3f} GB of weights per token at the copy bandwidth = "
        f"{_num(s.get('roofline_tok_s'), 0)} tok/s."
    )
    table = _columns(s["rows"], {
        "engine": lambda r: r["label"], "tok/s": lambda r: _num(r["tok_s"]),
        "ms/token": lambda r: _num(r["ms_per_token"], 2),
        "of roofline": lambda r: _share(r.get("roofline_share")),
    })  # fmt: skip
    lines = [caption, "", *table]
    if s.get("sampled"):
        lines += ["", f"Sampled: {s['sampled']}."]
    if s.get("ratios"):
        ratios = [f"{k.replace('_vs_', ' / ').replace('hf', 'HF')} {v:.2f}x" for k, v in s["ratios"].items()]
        lines += ["", "tok/s ratios: " + ", ".join(ratios)]
    return lines


def _profile(s: dict) -> list[str]:
    caption = (
        f"Prompts of {s['prompt_tokens']} tokens, all prefilled; wall: median of {s['timed_steps']} steps "
        f"timed one by one; the rest per step from torch.profiler over {s['profiled_steps']} more steps."
        + ("" if s.get("on_cuda") else " No CUDA here: device columns are not measured.")
    )
    return [caption, "", *_columns(s["rows"], {
        "engine": lambda r: r["engine"], "batch": lambda r: str(r["batch"]),
        "wall ms": lambda r: _num(r["wall_ms"], 2), "GPU busy ms": lambda r: _num(r["gpu_busy_ms"], 2),
        "busy share": lambda r: _share(r["busy_share"]), "kernels/step": lambda r: _num(r["kernels"], 0),
        "kernels/layer": lambda r: _num(r["kernels_per_layer"], 1),
        "host syncs/step": lambda r: _num(r["host_syncs"], 1),
        "H2D copies/step (pageable)": lambda r: f"{_num(r['h2d_copies'], 1)} ({_num(r['h2d_pageable'], 1)})",
        "D2H copies/step": lambda r: _num(r["d2h_copies"], 1),
    })]  # fmt: skip


def _sweep(s: dict) -> list[str]:
    caption = (
        f"Steady-state decode: {s['prompt_tokens']}-token prompts all prefilled, then the median of "
        f"{s['timed_steps']} decode steps timed one by one (prefill excluded)."
    )
    engines = list(dict.fromkeys(r["engine"] for r in s["rows"]))
    by_key = {(r["engine"], r["batch"]): r for r in s["rows"]}
    figures = {"step ms": ("step_ms", 2), "tok/s per request": ("per_request_tok_s", 1),
               "aggregate tok/s": ("aggregate_tok_s", 0)}  # fmt: skip
    columns = {"batch": lambda b: str(b)} | {
        f"{e} {name}": lambda b, e=e, key=key, digits=digits: _num(by_key.get((e, b), {}).get(key), digits)
        for e in engines
        for name, (key, digits) in figures.items()
    }
    return [caption, "", *_columns(sorted({r["batch"] for r in s["rows"]}), columns)]


def _throughput(s: dict) -> list[str]:
    w = s["workload"]
    caption = (
        f"{w['description']}: {w['requests']} requests, {w['prompt_tokens']:,} prompt and "
        f"{w['output_tokens']:,} output tokens."
    )
    table = _columns(s.get("rows", []), {
        "engine": lambda r: r["label"], "requests": lambda r: str(r["requests"]),
        "output tokens": lambda r: f"{r['output_tokens']:,}", "wall s": lambda r: _num(r["wall_s"], 2),
        "output tok/s": lambda r: _num(r["output_tok_s"]),
    })  # fmt: skip
    lines = [caption, "", *table]
    if s.get("ratio_vs_hf"):
        lines += ["", f"This engine / HF static batches: {s['ratio_vs_hf']:.2f}x output tok/s."]
    if s.get("overlap_ratio"):
        lines += [f"Overlap scheduling on / off: {s['overlap_ratio']:.2f}x output tok/s (one run each)."]
    return lines


def _speculative(s: dict) -> list[str]:
    caption = (
        f"{s['model']}: {s['prompts']} held-back prompts x {s['max_tokens']} tokens, greedy, methods "
        "interleaved prompt by prompt; tok/s over whole requests (prefill included)."
    )
    lines = [caption, "", *_columns(s["rows"], {
        "method": lambda r: r["method"], "tok/s": lambda r: _num(r["tok_s"]),
        "vs plain": lambda r: f"{r['speedup']:.2f}x", "tau": lambda r: _num(r["tau"], 2),
        "outputs differing from plain": lambda r: str(r["outputs_differing"]),
    })]  # fmt: skip
    if s.get("breakdown"):
        lines += [
            "",
            "Where a decode step's time goes (the first prompt alone, after its prefill; the device "
            "synchronised at each part, so the steps are slower than above): ms a step.",
            "",
            *_columns(s["breakdown"], {
                "method": lambda r: r["method"], "steps": lambda r: str(r["steps"]),
                "step": lambda r: _num(r["step_ms"], 2), "drafting": lambda r: _num(r["draft_ms"], 2),
                "forward": lambda r: _num(r["forward_ms"], 2), "the rest": lambda r: _num(r["other_ms"], 2),
                "forwards from a graph": lambda r: _share(r["graph_share"]),
            }),
        ]  # fmt: skip
    return lines


# Per section: its heading (the model's is its shape's name), the key its body needs measured, and the body.
SECTION_TABLES = {
    "bandwidth": (None, "copy_GBps", _bandwidth),
    "model": (None, "config", _model),
    "engines": ("### Start-up: tuning and graph capture", "rows", _engines),
    "decode": ("### Batch-1 decode", "rows", _decode),
    "profile": ("### One decode step", "rows", _profile),
    "sweep": ("### Batch sweep: per-request speed vs total throughput", "rows", _sweep),
    "throughput": ("### Offline throughput", "workload", _throughput),
    "speculative": ("## Speculative decoding at batch 1", "rows", _speculative),
}
