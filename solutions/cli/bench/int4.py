"""``python -m solutions bench int4``: the W4A16 Triton kernels on a GPU, read as bandwidth.

For each weight matrix of a SmolLM2-1.7B-shaped decoder layer and its LM head (``model_shapes``), at 1, 4
and 16 rows of bfloat16 activations: the time of ``awq_gemm`` (autotuned; RTN codes in groups of 64), the
weight bytes it must read (INT4 codes + float16 scales + uint8 zeros) per second and as a share of the
GPU's measured copy bandwidth (read + write bytes of ``dst.copy_(src)``, as ``bench gpu`` measures it), and
torch's bfloat16 ``F.linear`` on the same shape with its own figures. Every row also checks the kernel's
result against a float32 product of the dequantized weight.

Goal (one row): the kernel reads its weights at >= 60% of copy bandwidth. The last lines add up one
decoder layer's four products: bfloat16 time / INT4 time, the share of the end-to-end goal (INT4 decode
>= 2.5x bfloat16, both with CUDA graphs) that the matrix products alone can deliver.

Times are ``timing.median_ms`` (on a GPU, medians of ``triton.testing.do_bench``). ``--smoke`` runs a toy
shape through whatever device is there (the Triton interpreter on a CPU): it checks the script, its
figures mean nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench.machine import machine_name
from ...bench.model_shapes import SHAPES, ModelShape
from ...bench.timing import bandwidth_gbps, median_ms
from ...kernels.awq_gemm import awq_gemm
from ...quant.pack import pack_int4
from ...quant.rtn import GroupQuantized, quantize
from . import bench_parser

GOAL_SHARE = 0.6  # of copy bandwidth, at one row
LAYER_PRODUCTS = ("qkv", "o", "gate_up", "down")


def weight_shapes(shape: ModelShape) -> list[tuple[str, int, int]]:
    """(name, N, K) of each product of one decoder layer (fused QKV and gate/up, as the engine runs them),
    then the LM head."""
    h, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return [
        ("qkv", q + 2 * kv, h),
        ("o", h, q),
        ("gate_up", 2 * shape.intermediate_size, h),
        ("down", h, shape.intermediate_size),
        ("lm_head", shape.vocab_size, h),
    ]


def measure(name: str, n: int, k: int, rows: int, group_size: int, device: str, repeats: int) -> dict:
    """One shape at one row count: INT4 and bfloat16 times, bytes read, the kernel's error."""
    gen = torch.Generator(device=device).manual_seed(n * 7 + k)
    weight = torch.randn(n, k, generator=gen, device=device, dtype=torch.bfloat16) * 0.02
    g = quantize(weight, 4, group_size)
    qweight, scales, zeros = pack_int4(g.q), g.scales.half(), g.zeros
    x = torch.randn(rows, k, generator=gen, device=device, dtype=torch.bfloat16)
    int4 = lambda: awq_gemm(x, qweight, scales, zeros, group_size)  # noqa: E731
    bf16 = lambda: F.linear(x, weight)  # noqa: E731
    expected = x.float() @ GroupQuantized(g.q, scales.float(), zeros, 4, group_size).dequantize().T
    err = ((int4().float() - expected).abs().max() / expected.abs().max()).item()  # the first call autotunes
    return {
        "name": name, "n": n, "k": k, "rows": rows, "err": err,
        "int4_ms": median_ms(int4, device, repeats), "bf16_ms": median_ms(bf16, device, repeats),
        "int4_bytes": qweight.nbytes + scales.nbytes + zeros.nbytes, "bf16_bytes": weight.nbytes,
    }  # fmt: skip


def report(results: list[dict], copy_gbps: float, machine: str) -> list[str]:
    lines = [
        f"{machine}: W4A16 Triton (awq_gemm) vs bfloat16 F.linear; copy bandwidth {copy_gbps:,.0f} GB/s "
        "(read + write); weight bytes = INT4 codes + fp16 scales + uint8 zeros",
        f"{'product':<9}{'N x K':>13}{'rows':>5}{'INT4 us':>10}{'GB/s':>8}{'of copy':>9}"
        f"{'bf16 us':>10}{'GB/s':>8}{'of copy':>9}{'bf16/INT4':>11}{'max rel err':>13}",
    ]
    for r in results:
        int4_gbps = r["int4_bytes"] / r["int4_ms"] / 1e6
        bf16_gbps = r["bf16_bytes"] / r["bf16_ms"] / 1e6
        size = f"{r['n']} x {r['k']}"
        lines.append(
            f"{r['name']:<9}{size:>13}{r['rows']:>5}{r['int4_ms'] * 1e3:>10.1f}{int4_gbps:>8,.0f}"
            f"{int4_gbps / copy_gbps:>9.0%}{r['bf16_ms'] * 1e3:>10.1f}{bf16_gbps:>8,.0f}"
            f"{bf16_gbps / copy_gbps:>9.0%}"
            f"{r['bf16_ms'] / r['int4_ms']:>10.2f}x{r['err']:>13.1e}"
        )
    one_row = [r for r in results if r["rows"] == 1]
    if one_row:
        shares = {r["name"]: r["int4_bytes"] / r["int4_ms"] / 1e6 / copy_gbps for r in one_row}
        met = [name for name, share in shares.items() if share >= GOAL_SHARE]
        lines.append(
            f"goal: INT4 at one row reads its weights at >= {GOAL_SHARE:.0%} of copy bandwidth: met by "
            f"{len(met)} of {len(shares)} products ({', '.join(met) or 'none'}); "
            + ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
        )
    for rows in sorted({r["rows"] for r in results}):
        layer = [r for r in results if r["rows"] == rows and r["name"] in LAYER_PRODUCTS]
        if len(layer) == len(LAYER_PRODUCTS):
            int4, bf16 = sum(r["int4_ms"] for r in layer), sum(r["bf16_ms"] for r in layer)
            lines.append(
                f"one decoder layer's products at {rows} row(s): bf16 {bf16 * 1e3:.1f} us, "
                f"INT4 {int4 * 1e3:.1f} us: "
                f"{bf16 / int4:.2f}x (end-to-end goal, measured by bench gpu: INT4 decode >= 2.5x bf16)"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--shape", default="smollm2-1.7b", choices=sorted(SHAPES), help="whose matrices")
    add("--rows", type=int, nargs="+", default=[1, 4, 16], help="activation rows (batch)")
    add("--group-size", type=int, default=64)
    add("--smoke", action="store_true", help="a toy shape, on a CPU through the interpreter")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print("bench int4 times the W4A16 Triton kernels on a GPU; none here (--smoke: a toy shape on a CPU)")
        return 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("\n".join(table(SHAPES["tiny" if args.smoke else args.shape], args.rows, args.group_size, device)))
    return 0


def table(shape: ModelShape, rows: list[int], group_size: int, device: str) -> list[str]:
    """The report of every product of ``shape`` at each of ``rows`` (``bench quant`` prints it too)."""
    copy_gbps = bandwidth_gbps(1 << 30 if device == "cuda" else 1 << 24, device, repeats=3)
    repeats = 5 if device == "cuda" else 1
    results = [
        measure(name, n, k, r, group_size, device, repeats)
        for name, n, k in weight_shapes(shape)
        for r in rows
    ]
    machine = f"{machine_name(device)}, {shape.name} shapes, torch {torch.__version__}"
    return report(results, copy_gbps, machine)
