"""A CPU matrix product for a few rows that reads each weight once: the ``packed`` path of ``cpu_linear``.

A verify pass multiplies k + 1 rows (a root and its drafts) by every weight, and so does a batched decode
step of a few sequences. On a CPU that product is memory-bound like a one-row step: the weights are read
once, whatever the rows, if the kernel is built for it. torch's routes are not: measured on a 2-core Intel
Xeon (``bench decode`` prints every route's GB/s), MKL's GEMV streams 19-26 GB/s at one row, but its GEMM
and oneDNN's prepacked product fall to 10-12 GB/s at 8 rows (a general GEMM packs its operands, tiles for
large M and pays a dispatch that a 66-microsecond product notices). ``bench decode --rows`` shows what that
does to a verify pass.

``cpu_rows.c`` is the kernel, a few hundred lines of C: the weight packed in blocks of 16 output columns, each
block one contiguous run, and for each block up to 8 rows' partial sums held in registers while the block
streams past (its comment gives the loop). Each row's sums run in one fixed order, so a row's result is the
same alone or beside others (batch-invariant by construction).

The library is compiled on first use with the system's C compiler (``$CC``, else ``cc``; ``-O3
-march=native -fopenmp``, about a second) into ``paths.kernel_cache_dir()``, named by a hash of the source,
the flags and the CPU, and loaded with ``ctypes``. Where there is no compiler or the build fails,
``available()`` is False and ``cpu_linear`` does not offer the path.

Invariant: ``apply(x, pack(w), b)`` equals ``F.linear(x, w, b)`` up to float32 rounding of the sums (bfloat16
inputs are widened, summed in float32 and rounded once, as torch's CPU product does).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import torch

from ..paths import kernel_cache_dir

SOURCE = Path(__file__).with_name("cpu_rows.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
LANES = 16  # output columns per packed block (cpu_rows.c's LANES)
DTYPES = {torch.float32: "rows_f32", torch.bfloat16: "rows_bf16"}


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc"))


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernel (built on first use, then loaded from the cache), or None where it cannot be
    built."""
    compiler = _compiler()
    if compiler is None:
        return None
    identity = "\n".join([SOURCE.read_text(), compiler, " ".join(FLAGS), _cpu_flags()])
    path = kernel_cache_dir() / f"cpu_rows-{hashlib.sha1(identity.encode()).hexdigest()[:16]}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial.so")
        built = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(partial)], capture_output=True)
        if built.returncode != 0:
            return None
        partial.replace(path)  # atomic: a concurrent process never loads half a file
    lib = ctypes.CDLL(str(path))
    for name in DTYPES.values():
        function = getattr(lib, name)
        function.restype = None
        function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        function.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
    lib.rows_int4.restype = None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.rows_int4.argtypes = [
        pointer,
        ctypes.c_int,
        pointer,
        size,
        size,
        pointer,
        size,
        pointer,
        size,
        pointer,
    ]
    return lib


def supports(dtype: torch.dtype) -> bool:
    return dtype in DTYPES and library() is not None


class PackedWeight(NamedTuple):
    """A weight in the kernel's layout: ``blocks`` ``[ceil(N / 16), K, 16]``, each block of 16 output columns
    k-major and contiguous, the last one padded with zero columns; ``out_features`` is N."""

    blocks: torch.Tensor
    out_features: int


def pack(weight: torch.Tensor) -> PackedWeight:
    """``weight`` ``[N, K]`` in the kernel's layout."""
    n, k = weight.shape
    padded = torch.nn.functional.pad(weight, (0, 0, 0, -n % LANES))
    return PackedWeight(padded.reshape(-1, LANES, k).transpose(1, 2).contiguous(), n)


def apply(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``[M, K]`` (contiguous) times the packed weight, plus ``bias``: ``[M, N]`` in ``x``'s dtype."""
    blocks, n = packed
    if x.dtype != blocks.dtype:
        raise TypeError(f"the packed weight is {blocks.dtype}, the input {x.dtype}")
    x32 = x if x.dtype == torch.float32 else x.float()
    bias32 = None if bias is None else bias.float().contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    getattr(library(), DTYPES[blocks.dtype])(
        x32.data_ptr(),
        x.shape[0],
        blocks.shape[1],
        blocks.data_ptr(),
        n,
        None if bias32 is None else bias32.data_ptr(),
        out.data_ptr(),
    )
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def apply_int4(
    x: torch.Tensor, qweight: torch.Tensor, group_size: int, scale_offset: torch.Tensor
) -> torch.Tensor:
    """``x`` ``[M, K]`` (contiguous, float32 or bfloat16) times an INT4 weight in torch's CPU layout
    (``quant/linear.py``: ``qweight`` uint8 ``[N / 64, K, 32]`` tiles, ``scale_offset`` bfloat16
    ``[K / g, N, 2]``), as ``aten._weight_int4pack_mm_for_cpu`` computes it: the activations rounded to
    bfloat16, the result rounded to bfloat16 and given in ``x``'s dtype."""
    if x.dtype not in DTYPES:
        raise TypeError(f"the INT4 kernel takes float32 or bfloat16 inputs, got {x.dtype}")
    m, k = x.shape
    n = scale_offset.shape[1]
    scratch = torch.empty(m * k + m * (k // group_size), dtype=torch.float32)
    out = torch.empty(m, n, dtype=x.dtype)
    library().rows_int4(
        x.data_ptr(),
        x.dtype == torch.bfloat16,
        scratch.data_ptr(),
        m,
        k,
        qweight.data_ptr(),
        n,
        scale_offset.data_ptr(),
        group_size,
        out.data_ptr(),
    )
    return out
