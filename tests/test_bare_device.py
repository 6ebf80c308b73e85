"""The GPU session's entry points import only what a bare device image has (issue 47, item 1): through
``tools/bare_device.py``, which makes the server stack, the notebooks' widgets and plotting, pytest's plugins
and the GGUF reader unimportable, ``python -m solutions bench gpu`` starts and every file of CUDA tests is
collected by a plain pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bare(*args: str) -> subprocess.CompletedProcess:
    """``python tools/bare_device.py -m ARGS`` in the repository, pytest plugins not autoloaded (the device
    has none that the session may use)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    command = [sys.executable, "tools/bare_device.py", "-m", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def cuda_test_files() -> list[str]:
    """The test files holding tests marked ``requires_cuda``: what the session's CUDA part runs."""
    files = (ROOT / "tests").glob("test_*.py")
    return sorted(str(p.relative_to(ROOT)) for p in files if "requires_cuda" in p.read_text())


def test_the_blocked_imports_fail_as_on_the_device():
    """The guard is live: the HTTP server, which needs fastapi, cannot start through it."""
    done = bare("solutions", "serve", "--port", "0")
    assert done.returncode != 0
    assert "fastapi is not on the bare device image" in done.stderr, done.stderr[-2000:]


def test_bench_gpu_starts_without_the_server_stack():
    done = bare("solutions", "bench", "gpu", "--help")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: python -m solutions bench gpu" in done.stdout


def test_every_file_of_cuda_tests_is_collected_by_a_plain_pytest():
    files = cuda_test_files()
    assert "tests/test_cuda_graphs.py" in files, files
    done = bare("pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    collected = {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}
    assert collected == set(files), f"collected tests from {sorted(collected)}, expected {files}"
