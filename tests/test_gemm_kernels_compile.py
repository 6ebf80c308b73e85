"""The MoE grouped GEMM and the W4A16 kernels compile for an H100/H200 (sm_90) on any machine, GPU or not.

As ``test_kernels_compile.py`` does for attention: the interpreter accepts what the compiler may reject, so
every autotuning candidate (each can be the one a GPU picks) is compiled ahead of time for sm_90 with
Triton's own compiler and ptxas, in a separate process that imports the kernels compiled, not interpreted.
"""

from __future__ import annotations

import pytest
from kernel_device import assert_script_compiles_all

COMPILE_ALL = r'''
import triton
import torch
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from solutions.kernels import awq_gemm as awq, moe_gemm as moe


def compile_for_sm90(kernel, pointers, constexprs, num_warps=4, num_stages=3, runtime_ints=()):
    """Pointers: arg name -> element type; other args i32. Pointers and the ints Triton would see divisible by
    16 on the model's shapes carry that hint, as the launcher specializes them."""
    signature = {n: "constexpr" if n in constexprs else "*" + pointers[n] if n in pointers else "i32"
                 for n in kernel.arg_names}
    scalars = [n for n in kernel.arg_names if n not in constexprs and n not in runtime_ints]
    aligned = [n for n in kernel.arg_names if n in pointers or n in scalars]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    print("compiled", kernel.__name__, constexprs, num_warps, num_stages, flush=True)


# MoE: every candidate of every row block, gated and not (bf16), and the one float32 candidate per launch
for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    pointers = {"a_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "sorted_ids_ptr": "i64",
                "block_experts_ptr": "i64", "row_scale_ptr": dtype}
    for block_m in moe._CUDA_CANDIDATES:
        for gated in (True, False):
            named = {"a_ptr": torch.empty(0, dtype=torch_dtype)}
            configs = moe._grouped_gemm_autotuned.configs
            for c in moe._prune_configs(configs, named, BLOCK_M=block_m, GATED=gated):
                precision = "ieee" if dtype == "fp32" else "tf32"
                constexprs = dict(stride_wk=1, TOP_K=2 if gated else 1, GATED=gated, SCALE_ROWS=not gated,
                                  DOT_PRECISION=precision, BLOCK_M=block_m, **c.kwargs)
                compile_for_sm90(moe._grouped_gemm_kernel, pointers, constexprs, c.num_warps, c.num_stages,
                                 runtime_ints=("num_assignments", "num_blocks"))

# W4A16: every GEMV, skinny and prefill candidate (float32 activations: the small tiles they keep), K a
# multiple of the 128-wide tile or not, and the pass that adds split-K partial sums
for dtype in ("bf16", "fp32"):
    pointers = {"x_ptr": dtype, "qweight_ptr": "i32", "scales_ptr": "fp16", "zeros_ptr": "u8",
                "out_ptr": dtype, "partial_ptr": "fp32"}
    for even_k in (True, False):
        base = dict(stride_sg=1, stride_zg=1, GROUP=64, BLOCK_K=awq.BLOCK_K, EVEN_K=even_k)
        tiles = {(c.kwargs["BLOCK_N"], c.kwargs["STAGES"], c.num_warps) for c in awq._gemv_autotuned.configs}
        for block_n, stages, warps in sorted(tiles):
            constexprs = base | dict(BLOCK_N=block_n, STAGES=stages)
            compile_for_sm90(awq._w4a16_gemv_kernel, pointers, constexprs, warps, runtime_ints=("SPLIT_K",))
        tiles = {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["GROUP_SIZE_M"], c.kwargs["SWAP_AB"],
                  c.num_warps, c.num_stages) for c in awq._gemm_autotuned.configs}
        for block_m, block_n, group_m, swap, warps, stages in sorted(tiles):
            if dtype == "fp32" and (block_m > 64 or block_n > 64):
                continue  # float32 activations keep these tiles only
            constexprs = base | dict(BLOCK_M=block_m, BLOCK_N=block_n, GROUP_SIZE_M=group_m, SWAP_AB=swap,
                                     DOT_PRECISION="ieee" if dtype == "fp32" else "tf32")
            compile_for_sm90(awq._w4a16_gemm_kernel, pointers, constexprs, warps, stages,
                             runtime_ints=("M", "M_BUCKET", "SPLIT_K"))
    compile_for_sm90(awq._sum_splits_kernel, {"partial_ptr": "fp32", "out_ptr": dtype}, dict(BLOCK=1024),
                     runtime_ints=("numel", "SPLIT_K"))
print("all compiled")
'''


@pytest.mark.slow
def test_moe_and_w4a16_kernels_compile_for_sm90():
    assert_script_compiles_all(COMPILE_ALL, timeout_s=3600)
