"""The record of one ``bench gpu`` run: guarded, time-boxed sections that fill a JSON document, written (with
its markdown tables) after every section, so a run cut short still leaves what it measured.

    report.data = {"header": {...}, "bandwidth": {...}, "shapes": {name: {"model", "decode", "profile",
                   "sweep", "throughput"}}, "speculative": {...}}

Every section's dict starts with ``status`` ("ok", "failed", "timed out", "skipped") and ``seconds``; a failed
one carries ``error``, a skipped one ``reason``, and both keep what was measured before they stopped.
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

from .gpu_tables import render, render_section
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
    """What a running section fills (``out``) and when its time is up (``ends_at``, ``time.monotonic()``)."""

    def __init__(self, ends_at: float):
        self.out: dict = {}
        self.ends_at = ends_at

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
            section = Section(time.monotonic() + budget)
            start = time.monotonic()
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
