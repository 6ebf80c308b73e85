"""``python -m solutions bench kernels``: the fused layer ops (``kernels/fused_ops.py``) against the plain
torch chains they replace, on a GPU.

For SmolLM2-135M's and a 1.7B model's shapes, at 1, 64 and 2048 tokens (decode batches and a prefill chunk):
each fused op's time beside its plain chain (``PLAIN_OPS``, and for RoPE + store, ``apply_rope`` then the
Triton ``store_kv``), the bytes it moves per second against the device's copy bandwidth, and the ratio. Then
one decoder layer in a decode step over the paged Triton attention, with each ops set: its time and the
kernels it launches (counted with ``torch.profiler``; the goal is at most 10 with the fused set). Every op and
layer is captured in a CUDA graph and replayed (as the engine's decode runs), timed by
``triton.testing.do_bench`` medians. ``--smoke`` runs the same code on tiny shapes on any device (through the
Triton interpreter on a CPU): a check of the code, no figures. The table is printed last, with the machine's
name.
"""

from __future__ import annotations

import torch

from ...bench.kernels import LAUNCH_GOAL, SHAPES, layer_rows, op_rows
from ...bench.machine import machine_name
from ...bench.timing import bandwidth_gbps
from . import bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__)
    add = parser.add_argument
    add("--tokens", type=int, nargs="+", default=[1, 64, 2048], help="rows per op call")
    add("--batches", type=int, nargs="+", default=[1, 64], help="decode batch of the layer rows")
    add("--context", type=int, default=1024, help="tokens of context in the layer rows")
    add("--smoke", action="store_true", help="tiny shapes, any device: checks the code, no figures")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available()
    if not on_gpu and not args.smoke:
        print(
            "bench kernels times compiled kernels and needs CUDA; "
            "--smoke runs its code through the interpreter"
        )
        return 0
    device = torch.device("cuda" if on_gpu else "cpu")
    if args.smoke:
        shapes, tokens, batches, context = {"tiny": (96, 3, 1, 32, 80)}, [3], [2], 20
    else:
        shapes, tokens, batches, context = SHAPES, args.tokens, args.batches, args.context
    dtype = torch.bfloat16
    copy_gbps = bandwidth_gbps(1 << 30 if on_gpu else 1 << 20, device)
    ops = op_rows(shapes, tokens, dtype, device, copy_gbps)
    layers = layer_rows(shapes, batches, context, dtype, device)
    if args.smoke:
        print("\nSmoke run on tiny shapes: it checks this code; its figures mean nothing.")
    print(
        f"\nFused layer ops vs plain torch, bf16, graph-replayed, on {machine_name(device)} "
        f"(copy bandwidth {copy_gbps:.0f} GB/s):"
    )
    print("\n".join(ops))
    print(
        f"\nOne decoder layer of a decode step ({context} tokens of context), paged Triton attention "
        f"(goal: at most {LAUNCH_GOAL} kernels with the fused ops):"
    )
    print("\n".join(layers))
    return 0
