"""Run a Python module as on a bare CUDA machine: the packages this project installs that the device image
lacks (or that a GPU session must not lean on) cannot be imported.

    python tools/bare_device.py -m solutions bench gpu --device cpu ...
    python tools/bare_device.py -m pytest -v tests/test_cuda_graphs.py

The device machine has torch, triton, transformers, tokenizers, safetensors, numpy, pytest and hypothesis, and
no pip and no network (see the README's "On a GPU"). An import of a name in ``ABSENT`` raises ImportError
naming this script, so an entry point that reaches the HTTP stack, the notebooks' widgets or a pytest plugin
fails here, on a CPU, as it would there. ``tools/gpu_session.sh --dry-run`` runs every part through it and
``tests/test_bare_device.py`` imports the session's entry points and every file of CUDA tests through it.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

# Top-level module names: the server stack, the notebooks' plotting and widgets, the pytest plugins (xdist,
# pytest-timeout, nbval) and the GGUF reader (the bundled model's format: the parts that load it say so).
ABSENT = frozenset(
    {
        "fastapi",
        "uvicorn",
        "pydantic",
        "prometheus_client",
        "openai",
        "ipywidgets",
        "matplotlib",
        "xdist",
        "pytest_timeout",
        "nbval",
        "gguf",
    }
)


class AbsentOnDevice(importlib.abc.MetaPathFinder):
    """Refuses the modules in ``ABSENT`` (and their submodules) before any other finder looks, except those
    named in ``FASTMODE_BARE_ALLOW`` (comma-separated: what a session carried as wheels, gguf for one)."""

    def __init__(self):
        self.absent = ABSENT - set(os.environ.get("FASTMODE_BARE_ALLOW", "").split(","))

    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] in self.absent:
            raise ImportError(f"{name} is not on the bare device image (tools/bare_device.py blocks it)")
        return None


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "-m":
        sys.exit("usage: python tools/bare_device.py -m MODULE [ARGS...]")
    sys.meta_path.insert(0, AbsentOnDevice())
    sys.argv = [argv[1], *argv[2:]]
    sys.path[0] = os.getcwd()  # as `python -m` puts the working folder first (not this script's)
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
