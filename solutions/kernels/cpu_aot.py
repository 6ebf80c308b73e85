"""Small CPU functions compiled ahead of time by inductor's C++ backend (AOTInductor), kept on disk, called
for a couple of microseconds.

Between a decode step's matrix products sit chains of small elementwise operators (add, then RMSNorm; RoPE;
SiLU-mul). Run eagerly each operator is one dispatch and one pass over memory; inductor's C++ code generator
fuses a chain into one loop. ``torch.compile`` does that too, but every call of a compiled function first
evaluates dynamo's guards, which for a one-row decode costs more than the eager chain it replaces
(``python -m solutions bench decode --fused-ops float32`` measures both). So each chain is exported once
(``torch.export``, its sizes dynamic), compiled by AOTInductor into a shared library, and called through the
library's runner (``loader.run``): no guards, no Python between the call and the loop.

The library is kept in a directory the caller names, under a name that hashes the source of the functions it
runs, the example inputs' dtypes, the dynamic dimensions, torch's version and the caller's key (the CPU): a
later process loads it in milliseconds, a changed function or machine compiles anew. Inductor's own caches
(precompiled headers, compiled kernels) go beside it (``TORCHINDUCTOR_CACHE_DIR``, unless already set).

Compiling needs a C++ compiler (inductor's ``cpp.cxx``, ``$CXX`` or g++); where there is none, or it fails,
``compile_function`` raises ``CompileFailed`` saying why, and the caller keeps its eager path.

Invariant: a runner computes what the exported function computes, on inputs of the example's dtypes, ranks
and contiguous layout, for every size of the dynamic dimensions (at least 1). It checks nothing: callers check
their inputs' dtype, device, shapes and layout before calling it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

Runner = Callable[[list[torch.Tensor]], list[torch.Tensor]]


class CompileFailed(RuntimeError):
    """AOTInductor could not build or load a library (no C++ compiler, say); the message says why."""


def package_path(
    directory: Path,
    name: str,
    sources: Sequence[Callable],
    example_args: Sequence[torch.Tensor],
    dynamic_shapes: object,
    key: object,
) -> Path:
    """Where the library of a function compiled for these inputs lives: ``directory/name-<hash>.pt2``. The
    hash covers the source of ``sources`` (the function and any it calls), the inputs' dtypes and ranks, the
    dynamic dimensions, torch's version and ``key`` (what else the library depends on: the CPU, say)."""
    identity = json.dumps(
        {
            "source": [inspect.getsource(fn) for fn in sources],
            "inputs": [(str(t.dtype), t.dim()) for t in example_args],
            "dynamic": repr(dynamic_shapes),
            "torch": torch.__version__,
            "key": key,
        },
        sort_keys=True,
        default=str,
    )
    return directory / f"{name}-{hashlib.sha1(identity.encode()).hexdigest()[:16]}.pt2"


def compile_function(
    fn: Callable,
    example_args: Sequence[torch.Tensor],
    dynamic_shapes: Sequence[dict | None],
    path: Path,
    precision_casts: bool = True,
) -> Runner:
    """A runner for ``fn`` (``run([tensors]) -> [tensors]``): loaded from ``path`` if it is there, else
    exported, compiled and saved there first (under a temporary name, then renamed: concurrent processes never
    read half a file). Raises ``CompileFailed`` when there is no C++ compiler or building or loading fails.

    ``precision_casts`` keeps inductor rounding every intermediate to a low-precision dtype as eager torch
    does (``emulate_precision_casts``), so a bfloat16 chain gives the eager chain's results.
    """
    try:
        if not path.exists():
            require_compiler()
            _compile(fn, example_args, dynamic_shapes, path, precision_casts)
        return torch._inductor.aoti_load_package(str(path)).loader.run
    except CompileFailed:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the toolchain means: stay eager
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        raise CompileFailed(f"{path.name}: {type(error).__name__}: {first_line}") from error


def require_compiler() -> None:
    """Raise ``CompileFailed`` unless the C++ compiler inductor will call is on PATH."""
    compiler = [c for c in torch._inductor.config.cpp.cxx if c][-1]
    if shutil.which(compiler) is None:
        raise CompileFailed(f"no C++ compiler: {compiler} is not on PATH (set $CXX to one)")


class _Exported(torch.nn.Module):
    """``fn`` as the module ``torch.export`` takes."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return self.fn(*args)


def _compile(fn, example_args, dynamic_shapes, path: Path, precision_casts: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(path.parent / "inductor"))
    dynamic = (tuple(dynamic_shapes),)  # forward(*args) takes one tuple of inputs: so do its dynamic shapes
    exported = torch.export.export(_Exported(fn), tuple(example_args), dynamic_shapes=dynamic)
    partial = path.with_suffix(f".{os.getpid()}.partial.pt2")
    with warnings.catch_warnings():
        # torch's own packaging (torch 2.13) pickles its export's tree specs through an API it deprecates,
        # and warns about itself on every compile: nothing a caller can change
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        torch._inductor.aoti_compile_and_package(
            exported, package_path=str(partial), inductor_configs={"emulate_precision_casts": precision_casts}
        )
    partial.replace(path)
