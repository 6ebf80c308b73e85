"""Where kernel tests run: compiled on CUDA when the machine has a GPU, through the Triton interpreter
otherwise (``conftest.py`` sets ``TRITON_INTERPRET=1`` before any kernel module loads). Every tensor a kernel
test hands to a kernel is made on ``KERNEL_DEVICE``; tolerances may differ by device (``ON_GPU``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

ON_GPU = torch.cuda.is_available()
KERNEL_DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def assert_script_compiles_all(script: str, timeout_s: int) -> None:
    """Run ``script`` (it compiles kernels ahead of time and prints "compiled ..." per kernel, then "all
    compiled") in a fresh process with the kernels compiled, not interpreted; fail naming how far it got."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if "all compiled" not in result.stdout:
        compiled = result.stdout.strip().splitlines()
        raise AssertionError(
            f"a kernel does not compile for sm_90 (after {len(compiled)} that did):\n{result.stderr[-3000:]}"
        )
