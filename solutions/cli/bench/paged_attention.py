"""``python -m solutions bench paged_attention``: the paged-attention kernels against their goals on a GPU.

- Decode is memory-bound: each step reads every sequence's whole K/V once, so its figure is bytes moved (K/V
  read, q read, output written) per second, set against a large device-to-device copy (read + write) timed the
  same way. Goal: at least 60% of copy bandwidth at batch >= 16 and context >= 2048. Batch 1, 16 and 64 at
  512, 2048 and 8192 tokens, for SmolLM2-135M's heads (9 query / 3 KV, D 64) and a 1.7B model's (32 / 32).
  Each decode is tuned for its bucket (``tune_decode``), then captured in a CUDA graph and replayed, as the
  engine runs it; the eager time (Python launch overhead included) is printed beside it.
- Batch-1 latency against torch SDPA over the same K/V stored densely (also graph-replayed). Goal: at most
  1.5x SDPA's time.
- Varlen paged prefill of fresh sequences is compute-bound: TFLOP/s as in ``bench attention`` (4 * Lq * Lk * D
  per head, halved for causal), beside SDPA on the same sequences stored densely. Goal: at least 0.9x SDPA.

Times are ``triton.testing.do_bench`` medians (L2 flushed before each run). ``--smoke`` (any machine) runs
the same code on tiny shapes, through the Triton interpreter on a CPU (``import solutions`` chooses it there):
a check of this code, never a figure. The table is printed last, with the machine's name.
"""

from __future__ import annotations

import torch

from ...bench.machine import machine_name
from ...bench.paged_attention import (
    BANDWIDTH_GOAL,
    COPY_BYTES,
    HEAD_SHAPES,
    LATENCY_GOAL,
    NO_CUDA,
    PREFILL_GOAL,
    decode_rows,
    prefill_rows,
)
from ...bench.timing import bandwidth_gbps
from . import bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes, any device: checks the code, no figures"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        head_shapes, batches, contexts = {"tiny": (3, 1, 32)}, [1, 2], [40]
        prefill_shapes, prefill_seqs, prefill_len = [(3, 1, 32)], 2, 24
    elif not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    else:
        head_shapes, batches, contexts = HEAD_SHAPES, args.batches, args.contexts
        prefill_shapes, prefill_seqs, prefill_len = [(9, 3, 64), (32, 8, 128)], 4, 2048
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    copy_gbps = bandwidth_gbps(COPY_BYTES if device.type == "cuda" else 1 << 20, device)
    decode = decode_rows(head_shapes, batches, contexts, device, copy_gbps)
    prefill = prefill_rows(prefill_shapes, prefill_seqs, prefill_len, device)
    if args.smoke:
        print("\nSmoke run on tiny shapes: it checks this code; its figures mean nothing.")
    print(
        f"\nPaged decode, bf16, block 16, on {machine_name(device)} (copy bandwidth {copy_gbps:.0f} GB/s): "
        f"goals >= {BANDWIDTH_GOAL:.0%} of copy bandwidth at batch >= 16 and context >= 2048, batch-1 time "
        f"<= {LATENCY_GOAL}x SDPA's on the same K/V stored densely",
        *decode,
        f"\nVarlen paged prefill, causal, bf16, beside torch SDPA (goal >= {PREFILL_GOAL}x):",
        *prefill,
        sep="\n",
    )
    return 0
