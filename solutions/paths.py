"""Where the engine keeps files on this machine, outside the repository.

``cache_dir()``: ``$FASTMODE_CACHE``, default ``~/.cache/fastmode``: converted weights (``model/loader.py``),
the CPU paths measured fastest (``kernels/cpu_linear.py``, ``model/cpu_layer_ops.py``),
MoE-fied model folders.
``kernel_cache_dir()``: ``$FASTMODE_KERNEL_CACHE``, default ``~/.cache/fastmode/kernels``: the CPU chains
compiled ahead of time. Not under ``$FASTMODE_CACHE``, which a run (or a test) may point at a fresh folder for
its models: compiled code depends on the machine and torch, not on the models, and takes minutes to build.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CACHE = Path.home() / ".cache" / "fastmode"
REPO_DIR = Path(__file__).resolve().parent.parent
"""The checkout this package runs from: ``data/`` (shipped artefacts, each with its provenance) and
``results/`` (benchmark runs) stand beside ``solutions/``."""
DATA_DIR = REPO_DIR / "data"


def cache_dir() -> Path:
    return Path(os.environ.get("FASTMODE_CACHE", DEFAULT_CACHE))


def kernel_cache_dir() -> Path:
    return Path(os.environ.get("FASTMODE_KERNEL_CACHE", DEFAULT_CACHE / "kernels"))


def shown(path: Path) -> str:
    """``path`` as a message shows it: from ``~`` under the home folder (the same on every machine)."""
    home = Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)
