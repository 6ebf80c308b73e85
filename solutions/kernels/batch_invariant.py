"""Batch-invariant CPU numerics: a row's result does not depend on the rows computed beside it.

Greedy decoding should give one answer per prompt whether a token is decoded alone, in a batch, after a prefix
served from the prefix cache, or verified among a speculative step's rows. In exact arithmetic it does; in
floating point a kernel that sums in another order for another row count (a matrix-vector product for one row,
a blocked GEMM for several; attention padded to the batch's longest context and masked; keys read in block
order instead of token order) changes the last bits, and a near-tie between two tokens can flip. A bfloat16
cast (before every INT4 product) turns such a last-bit difference into a whole bfloat16 step about once per
layer, so INT4 and bfloat16 engines diverge within tens of tokens.

``FASTMODE_BATCH_INVARIANT=1`` (vLLM's ``VLLM_BATCH_INVARIANT``, after "Defeating Nondeterminism in LLM
Inference", Thinking Machines 2025) makes every CPU path the engine runs sum each row in one fixed order:

- attention (``kernels/paged_torch.py``; draft trees: ``speculative/tree.py``): each query row attends alone,
  over exactly its context in token order (a tree node: its context, then its own path), one unmasked SDPA
  call per row;
- float32 and bfloat16 linears (``kernels/cpu_linear.py``): the course's packed kernel
  (``kernels/cpu_rows.c``, each row summed in one order whatever the rows beside it) at every row count; where
  it cannot be built, oneDNN's product for every row count, a lone row padded to two (oneDNN takes another
  kernel for one row when the input is wider than 1024);
- the elementwise chains run eagerly (``PLAIN_OPS``) at every row count, and the compiled one-token decode
  layers stay off (they round differently from the modules that run several rows);
- INT4 linears (``quant/linear.py``): the packed kernel's ``rows_int4`` at every row count (torch's INT4
  product, row-invariant as it is, where the kernel cannot be built; ``tests/test_batch_invariance.py``).

It costs speed: a verify pass and a prefill make one attention call per row, and the decode step loses its
compiled layers (``bench decode --rows`` measures both settings). Without a C compiler, dense bfloat16
linears are not covered (torch's kernel sums in another order from four rows on).
"""

from __future__ import annotations

import os

ENV = "FASTMODE_BATCH_INVARIANT"


def batch_invariant() -> bool:
    """``$FASTMODE_BATCH_INVARIANT``: "1" computes each row in one fixed order, "0" (the default) does not."""
    value = os.environ.get(ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
    return value == "1"
