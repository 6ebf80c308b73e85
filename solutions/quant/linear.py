"""A linear layer whose weight is stored as packed INT4 codes with per-group scales and zero points.

``QuantLinear`` computes ``y = x W^T`` with ``W[n, k] = (q[n, k] - zero[n, g]) * scale[n, g]``,
``g = k // group_size``, never materialising ``W`` in the hot path. The storage depends on the device:

- CUDA: ``qweight`` int32 ``[N, K/8]`` (``quant.pack`` layout), ``scales`` float16 and ``zeros``
  uint8 ``[N, K/g]``; the Triton W4A16 kernels in ``kernels.awq_gemm`` dequantize inside the GEMM.
- CPU: torch's own int4 kernel, ``aten._weight_int4pack_mm_for_cpu``. Its weight is uint8
  ``[N, K/2]`` in a tiled layout made by ``aten._convert_weight_to_int4pack_for_cpu``, and it
  dequantizes ``(q - 8) * scale + offset``, so the zero point becomes ``offset = (8 - zero) * scale``;
  scale and offset sit in one bfloat16 ``[K/g, N, 2]`` tensor, and activations go in as bfloat16 (float32
  ones take a path about 30x slower, so float32 activations are cast; a bfloat16 engine needs no cast).

On a CPU a call (a verify pass, a few sequences decoding together, a prompt) may instead run the course's
own kernel over the same buffers (``kernels/cpu_rows.c``'s ``rows_int4``: each weight read once whatever the
rows, each row summed in one fixed order), where ``use_fastest_int4`` measured it faster than torch's for the
shape and row count; under ``$FASTMODE_BATCH_INVARIANT=1`` it runs at every row count, prompts included (a
prompt's K/V must come out as a lone decode would compute them). It
rounds its result to bfloat16 as torch's kernel does.

Either way one INT4 code costs half a byte and a group adds 4 bytes (CPU) or 3 bytes (CUDA).
``rows(ids)`` dequantizes chosen rows only, so a tied embedding can look tokens up in the LM head's
packed weight instead of keeping a float copy.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..kernels import cpu_rows
from ..kernels.awq_gemm import awq_gemm
from ..kernels.batch_invariant import batch_invariant
from ..kernels.cpu_linear import (
    REGIMES,
    SMALL_ROWS,
    WORKING_SET_BYTES,
    cached_decisions,
    fastest_rounds,
    machine_key,
    rows_table,
)
from ..paths import cache_dir
from .pack import pack_int4, unpack_int4
from .rtn import GroupQuantized, quantize

# The CPU kernel's tiled layout as read by ``_cpu_rows``: rows in blocks of 64; for each block and input
# channel k, 32 bytes whose low nibbles are rows 0..31 of the block and high nibbles rows 32..63.
CPU_BLOCK_N = 64
CPU_GROUP_SIZES = (32, 64, 128, 256)
INT4_PATHS = ("torch", "packed")  # torch's int4 kernel, the course's (kernels/cpu_rows.c)
INT4_CACHE_FILE = "cpu_int4_linear.json"


def cpu_kernel_fits(out_features: int, in_features: int, group_size: int) -> bool:
    """Whether torch's CPU int4 kernel (and ``_cpu_rows``' reading of its layout) takes this shape."""
    return out_features % CPU_BLOCK_N == 0 and in_features % 32 == 0 and group_size in CPU_GROUP_SIZES


def int4_mm_cpu(
    x: torch.Tensor, qweight: torch.Tensor, group_size: int, scale_offset: torch.Tensor
) -> torch.Tensor:
    """``x [rows, K] @ W^T`` through torch's CPU int4 kernel, ``W`` as ``QuantLinear`` keeps it on a CPU
    (``qweight`` tiled uint8, ``scale_offset`` bfloat16 ``[K/g, N, 2]``); activations go in as bfloat16 and
    the result comes back in ``x``'s dtype (no cast at all for a bfloat16 ``x``)."""
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), qweight, group_size, scale_offset)
    return out.to(x.dtype)


class QuantLinear(nn.Module):
    """``y = x W^T`` for a group-quantized ``W`` ``[out_features, in_features]``; no bias."""

    def __init__(self, quantized: GroupQuantized, dtype: torch.dtype):
        super().__init__()
        self.out_features, self.in_features = quantized.q.shape
        self.w_bit, self.group_size, self.dtype = quantized.w_bit, quantized.group_size, dtype
        # rows 0..SMALL_ROWS -> "torch" or "packed", and the path for more rows (set by use_fastest_int4);
        # None: torch's kernel throughout
        self.rows_paths: list[str] | None = None
        self.prefill_path = "torch"
        device = quantized.q.device
        if device.type == "cuda":
            self.backend = "triton"
            self.register_buffer("qweight", pack_int4(quantized.q))
            self.register_buffer("scales", quantized.scales.half())
            self.register_buffer("zeros", quantized.zeros)
        elif cpu_kernel_fits(self.out_features, self.in_features, self.group_size):
            self.backend = "cpu"
            codes = quantized.q.to(torch.int32).contiguous()
            self.register_buffer("qweight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2))
            offsets = (8 - quantized.zeros.float()) * quantized.scales
            scale_offset = torch.stack([quantized.scales, offsets], dim=-1).transpose(0, 1)
            self.register_buffer("scale_offset", scale_offset.to(torch.bfloat16).contiguous())
        else:
            raise ValueError(
                f"torch's CPU int4 kernel needs out_features % {CPU_BLOCK_N} == 0, "
                f"in_features % 32 == 0 and group_size in {CPU_GROUP_SIZES}; "
                f"got {self.out_features} x {self.in_features}, g{self.group_size}"
            )

    @classmethod
    def from_float(
        cls, weight: torch.Tensor, w_bit: int, group_size: int, max_val: torch.Tensor | None = None
    ) -> QuantLinear:
        """Round-to-nearest quantize ``weight`` (clipped to ``max_val`` per group if given),
        in its dtype and device."""
        return cls(quantize(weight, w_bit, group_size, max_val), weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows_paths is not None:
            flat = x.reshape(-1, self.in_features)
            rows = flat.shape[0]
            if (self.rows_paths[rows] if rows <= SMALL_ROWS else self.prefill_path) == "packed":
                out = cpu_rows.apply_int4(flat.contiguous(), self.qweight, self.group_size, self.scale_offset)
                return out.reshape(*x.shape[:-1], self.out_features)
        if self.backend == "cpu" and x.dtype == torch.bfloat16 and x.dim() == 2 and x.is_contiguous():
            # The common case of a bfloat16 engine (dtype "auto" on a CPU with native bfloat16):
            # no cast, no reshape.
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, self.qweight, self.group_size, self.scale_offset
            )
        flat = x.reshape(-1, self.in_features)
        if self.backend == "cpu":
            out = int4_mm_cpu(flat, self.qweight, self.group_size, self.scale_offset)
        else:
            out = awq_gemm(flat, self.qweight, self.scales, self.zeros, self.group_size).to(x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Dequantized rows ``W[ids]`` ``[..., in_features]`` in the module's dtype."""
        flat = ids.reshape(-1)
        if self.backend == "cpu":
            codes, scales, offsets = self._cpu_rows(flat)
            w = (codes.float() - 8).view(len(flat), -1, self.group_size) * scales[..., None] + offsets[
                ..., None
            ]
        else:
            codes = unpack_int4(self.qweight[flat]).float().view(len(flat), -1, self.group_size)
            w = (codes - self.zeros[flat].float()[..., None]) * self.scales[flat].float()[..., None]
        return w.reshape(*ids.shape, self.in_features).to(self.dtype)

    def _cpu_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Codes ``[R, K]``, scales and offsets ``[R, K/g]`` of ``rows``,
        read out of the CPU kernel's layout."""
        tiles = self.qweight.view(self.out_features // CPU_BLOCK_N, self.in_features, CPU_BLOCK_N // 2)
        block, within = rows // CPU_BLOCK_N, rows % CPU_BLOCK_N
        byte = tiles[block, :, within % (CPU_BLOCK_N // 2)]  # [R, K]
        high = (within >= CPU_BLOCK_N // 2)[:, None]
        codes = torch.where(high, byte >> 4, byte & 0xF)
        scale_offset = self.scale_offset[:, rows].float()  # [K/g, R, 2]
        return codes, scale_offset[..., 0].T, scale_offset[..., 1].T

    def dequantize(self) -> torch.Tensor:
        """The whole weight ``[out_features, in_features]`` in the module's dtype
        (for tests and inspection)."""
        return self.rows(torch.arange(self.out_features, device=self.qweight.device))

    def extra_repr(self) -> str:
        return (
            f"{self.in_features} -> {self.out_features}, INT{self.w_bit} g{self.group_size}, {self.backend}"
        )


def _int4_call(path: str, module: QuantLinear, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    if path == "packed":
        return lambda: cpu_rows.apply_int4(x, module.qweight, module.group_size, module.scale_offset)
    return lambda: int4_mm_cpu(x, module.qweight, module.group_size, module.scale_offset)


@torch.no_grad()
def measure_int4(modules: list[QuantLinear]) -> dict[str, dict]:
    """Torch's INT4 kernel against the packed one on ``modules`` (one shape) in each regime of rows, as
    ``cpu_linear.measure_shape`` times the float paths: weights cycled through so that each call reads its
    weight from memory, alternated rounds, each path's fastest. ``{regime: {path, us}}``."""
    count = max(2, min(len(modules), WORKING_SET_BYTES // max(1, modules[0].qweight.nbytes)))
    pool = [modules[i % len(modules)] for i in range(count)]
    generator = torch.Generator().manual_seed(0)
    entry = {}
    for regime, rows in REGIMES.items():
        x = torch.randn(rows, modules[0].in_features, generator=generator)
        calls = {
            path: [_int4_call(path, m, x) for m in (pool[:2] if regime == "prefill" else pool)]
            for path in INT4_PATHS
        }
        best = fastest_rounds(calls)
        us = {path: round(t * 1e6, 2) for path, t in best.items()}
        entry[regime] = {"path": min(best, key=best.get), "us": us}
    return entry


def use_fastest_int4(model: nn.Module) -> dict[str, dict]:
    """Give each CPU ``QuantLinear`` of ``model`` the INT4 product measured fastest for its shape at each row
    count up to ``SMALL_ROWS`` (cached in ``cache_dir()/cpu_int4_linear.json`` per machine), or under
    ``$FASTMODE_BATCH_INVARIANT=1`` the packed kernel at every row count. Nothing changes where the packed
    kernel cannot be built. Returns the measured decisions (shape key -> ``{regime: {path, us}}``; none in the
    invariant mode, which measures nothing)."""
    modules = [m for m in model.modules() if isinstance(m, QuantLinear) and m.backend == "cpu"]
    if not modules or cpu_rows.library() is None:
        return {}
    if batch_invariant():  # the row-invariant kernel at every row count, prompts included: nothing to measure
        for module in modules:
            module.rows_paths, module.prefill_path = ["packed"] * (SMALL_ROWS + 1), "packed"
        return {}
    by_shape: dict[str, list[QuantLinear]] = {}
    for module in modules:
        key = f"int4g{module.group_size}:{module.out_features}x{module.in_features}"
        by_shape.setdefault(key, []).append(module)
    machine = machine_key({"paths": list(INT4_PATHS), "regimes": REGIMES})
    measures = {key: (lambda group=group: measure_int4(group)) for key, group in by_shape.items()}
    decisions = cached_decisions(measures, True, cache_dir() / INT4_CACHE_FILE, machine, INT4_PATHS, REGIMES)
    for key, group in by_shape.items():
        table = rows_table({regime: pick["path"] for regime, pick in decisions[key].items()})
        for module in group:
            module.rows_paths, module.prefill_path = table, decisions[key]["prefill"]["path"]
    return decisions


class QuantEmbedding(nn.Module):
    """Token embedding that reads the rows of a (tied) ``QuantLinear``: the packed matrix is stored once."""

    def __init__(self, table: QuantLinear):
        super().__init__()
        self.table = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table.rows(ids)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized table, built on demand (code that reads ``embed_tokens.weight`` still works)."""
        return self.table.dequantize()
