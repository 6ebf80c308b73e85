"""The attention and fused-op kernels compile for an H100/H200 (sm_90) on any machine, GPU or not.

The interpreter runs a kernel as Python and accepts what the compiler rejects (a name rebound to another shape
inside a runtime ``if``, say), so the CPU tests alone would let such a kernel reach the GPU broken. Here each
kernel is compiled ahead of time for sm_90 (Triton's own compiler and ptxas, no device needed) with the
constexpr combinations the engine launches. A separate process imports the kernels compiled, not interpreted.
"""

from __future__ import annotations

import pytest
from kernel_device import assert_script_compiles_all

COMPILE_ALL = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from solutions.kernels import flash_attention as fa, fused_ops as fo, paged_attention as pa

FLOATS = {"qk_scale", "eps"}


def compile_for_sm90(kernel, pointers, constexprs, num_warps=4, num_stages=2):
    """Pointers: arg name -> element type ("bf16", "fp32", "i32"...); other args are i32 (floats: fp32)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    # Pointers and strides divisible by 16, as the launcher specializes them for allocated tensors.
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in pointers}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    print("compiled", kernel.__name__, constexprs, flush=True)


def same(names, dtype):
    return {n: dtype for n in names}


ints = same(["block_table", "query_start_loc", "seq_lens"], "i32")
# fp32 at D 16: the engine tests' tiny model on a GPU
for dtype, head_dim in (("bf16", 64), ("fp32", 128), ("fp32", 16)):
    kv = same(["Q", "K_cache", "V_cache"], dtype)
    for split in (True, False):
        out = same(["Out", "Lse"], "fp32" if split else dtype)
        compile_for_sm90(pa._paged_decode, kv | out | ints, dict(BLOCK_SIZE=16, HEAD_DIM=head_dim, BLOCK_H=16,
                         SPLIT=split, BLOCK_N=64), num_stages=3)
    compile_for_sm90(pa._paged_prefill, kv | same(["Out"], dtype) | ints,
                     dict(BLOCK_SIZE=16, HEAD_DIM=head_dim, BLOCK_M=64, BLOCK_N=32), num_stages=2)
    for causal, varlen, lse in ((True, False, True), (False, True, False)):
        compile_for_sm90(fa._flash_fwd, same(["Q", "K", "V", "Out"], dtype) | same(["LSE"], "fp32")
                         | same(["cu_q", "cu_k"], "i32"), dict(CAUSAL=causal, VARLEN=varlen, STORE_LSE=lse,
                         HEAD_DIM=head_dim, BLOCK_M=64, BLOCK_N=32))
compile_for_sm90(pa._merge_splits, same(["Partial", "Lse"], "fp32") | same(["Out"], "bf16"),
                 dict(HEAD_DIM=64, BLOCK_S=32), num_warps=1)
for dtype in ("bf16", "fp32"):
    for residual in (True, False):
        compile_for_sm90(fo._add_rms_norm, same(["X", "Residual", "Weight", "Normed", "NewResidual"], dtype),
                         dict(HAS_RESIDUAL=residual, BLOCK=1024))
    # 9 query and 3 KV heads, D 64: SmolLM2's (the query and KV tiles differ in shape)
    compile_for_sm90(fo._rope, same(["QK", "Cos", "Sin"], dtype), dict(HALF=32, BLOCK_HALF=32, BLOCK_H=16))
    compile_for_sm90(fo._silu_mul, same(["GateUp", "Out"], dtype), dict(BLOCK=1024))
    compile_for_sm90(fo._rope_store_kv,
                     same(["QKV", "Cos", "Sin"], dtype) | same(["K_cache", "V_cache"], "fp32")
                     | same(["slot_mapping"], "i64"),
                     dict(BLOCK_SIZE=16, HALF=32, BLOCK_HALF=32, BLOCK_HQ=16, BLOCK_HKV=4))
print("all compiled")
'''


@pytest.mark.slow
def test_kernels_compile_for_sm90():
    assert_script_compiles_all(COMPILE_ALL, timeout_s=1800)
