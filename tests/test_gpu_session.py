"""``tools/gpu_session.sh --dry-run``: the GPU session's parts and sections, run on this CPU through the bare
device image's imports (the tiny shape, quick sizes, the graph stand-in), so the script cannot rot between GPU
runs (issue 47); its limits fit the session's 8 minutes; and the per-test time guard it relies on instead of
pytest-timeout cuts a stuck test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_session.sh"


def session(out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "COMMIT": "dry-run"}
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu_session")
    done = session(out)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return out, (out / "session.log").read_text()


def bench_documents(out: Path) -> list[dict]:
    """The ``bench gpu`` documents in the order the parts wrote them."""
    paths = sorted(out.glob("gpu_*.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) for p in paths]


def test_every_default_part_runs_and_the_limits_fit_eight_minutes(dry_run):
    _, log = dry_run
    limits = re.search(r"parts (.+); limits add to (\d+) s of (\d+) s; dry run", log)
    assert limits, log[-2000:]
    assert limits.group(1).split() == ["engine", "throughput", "small", "cuda-tests", "kernels"]
    assert int(limits.group(2)) <= int(limits.group(3)) == 480
    for part in ("engine", "throughput", "small", "cuda tests", "bench paged_attention"):
        assert f"{part} exit 0" in log, f"the {part} part failed on the dry run:\n{log[-3000:]}"
    assert "== " in log.splitlines()[-1] and log.rstrip().endswith("end")


def test_the_bench_parts_write_every_section_with_start_up_recorded(dry_run):
    out, _ = dry_run
    docs = bench_documents(out)
    assert len(docs) == 3, "engine, throughput and small each write a document"
    sections = [list(doc["shapes"]["tiny"]) for doc in docs]
    assert sections == [
        ["model", "engines", "decode", "profile"],
        ["model", "engines", "throughput"],
        ["model", "engines", "decode", "profile"],
    ]
    for doc in docs:
        assert doc["header"]["commit"] == "dry-run" and doc["header"]["device"] == "cpu"
        statuses = {key: s["status"] for key, s in doc["shapes"]["tiny"].items()}
        assert set(statuses.values()) == {"ok"}, statuses
    engine = docs[0]
    assert [doc["bandwidth"]["status"] for doc in (engine, docs[2])] == ["ok", "ok"], "each decode's roofline"
    graphs = next(r for r in engine["shapes"]["tiny"]["engines"]["rows"] if r["engine"] == "graphs")
    assert [c["bucket"] for c in graphs["captures"]] == [4, 2, 1], "the stand-in captured every bucket"
    decode_rows = [r["engine"] for r in engine["shapes"]["tiny"]["decode"]["rows"]]
    assert decode_rows == ["eager", "graphs", "sampled", "hf"]
    assert docs[1]["shapes"]["tiny"]["throughput"]["keys_tuned_in_timed_run"] == 0


def test_the_cuda_tests_are_collected_by_a_plain_pytest(dry_run):
    out, _ = dry_run
    report = (out / "tests_cuda.txt").read_text()
    assert re.search(r"\d+ skipped", report) and "error" not in report.lower(), report[-2000:]
    assert "SKIPPED" in report and "needs a CUDA GPU" in report
    assert (out / "kernels.txt").read_text().strip(), "the kernel bench printed nothing"


def test_a_selection_past_eight_minutes_is_refused(tmp_path):
    done = session(tmp_path, "engine", "throughput", "small", "cuda-tests", "kernels", "tests", timeout=30)
    assert done.returncode == 2
    assert "pass the session's 480 s" in (tmp_path / "session.log").read_text()
    unknown = session(tmp_path, "benchmarks", timeout=30)
    assert unknown.returncode == 2 and "unknown part benchmarks" in unknown.stderr


@pytest.mark.skipif(
    not os.environ.get("FASTMODE_GUARD_SELFTEST"), reason="a stuck test for the next test to run, alone"
)
def test_stuck():
    time.sleep(60)


def test_the_time_guard_cuts_a_stuck_test():
    env = {**os.environ, "FASTMODE_TEST_TIMEOUT": "1", "FASTMODE_GUARD_SELFTEST": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"{__file__}::test_stuck"]
    start = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "ran past FASTMODE_TEST_TIMEOUT=1 s" in done.stdout
    assert time.monotonic() - start < 50, "the stuck test ran its whole minute"
