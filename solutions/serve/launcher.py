"""Start ``python -m solutions serve`` as a child process and wait for it: for benchmarks and notebooks.

``with running_server(options) as url:`` yields ``http://127.0.0.1:PORT`` once ``/health`` answers, and
stops the process on the way out, whatever happened inside the block.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ..engine_options import engine_argv

PACKAGE = __package__.split(".")[0]  # "solutions" (or "labs")
PACKAGE_PARENT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(
    engine_options: dict[str, Any],
    api_key: str | None = None,
    startup_timeout_s: float = 180,
    env: dict[str, str] | None = None,
    program: list[str] | None = None,
) -> Iterator[str]:
    """Run the server on a free loopback port; yield its base URL once healthy; always stop it.

    ``program`` is the command that takes ``serve``'s options (default ``python -m solutions serve``; the
    tests pass a wrapper that injects a fault); ``env`` adds to this process's environment.
    Raises RuntimeError with the server's last log lines if it exits or stays silent past the timeout.
    """
    port = free_port()
    command = program or [sys.executable, "-m", PACKAGE, "serve"]
    command = [*command, "--port", str(port), "--log-level", "warning"]
    command += engine_argv(engine_options) + (["--api-key", api_key] if api_key else [])
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PACKAGE_PARENT), child_env.get("PYTHONPATH")])
    )
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, env=child_env, stdout=log, stderr=subprocess.STDOUT)

        def tail() -> str:
            log.seek(0)
            return log.read()[-3000:]

        try:
            deadline = time.monotonic() + startup_timeout_s
            while not _healthy(url):
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited with code {process.returncode}:\n{tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the server did not become healthy within {startup_timeout_s} s:\n{tail()}"
                    )
                time.sleep(0.5)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
