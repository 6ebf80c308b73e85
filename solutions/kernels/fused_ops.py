"""Fused Triton kernels for the elementwise work between a decoder layer's matrix products.

In plain torch (``model/llama.py``'s ``PLAIN_OPS``) each of these chains is several kernels, each reading and
writing the whole activation: an add and a norm are about eight (add, cast, pow, mean, add, rsqrt, mul, cast,
mul), RoPE five, SiLU-mul two. Here each chain is one launch that reads every input once and writes every
output once, with the same rounding: a half-precision value is rounded wherever the torch chain rounds it, so
the fused ops differ from ``PLAIN_OPS`` only in the order of float32 sums (the norm's mean) and in the last
bit of the special functions (``rsqrt``, ``exp``).

- ``add_rms_norm(x, residual, weight, eps) -> (normed, new_residual)``: one program per token.
- ``rope(qk, cos, sin)``: rotate-half RoPE of every head of ``qk`` ``[T, H, D]`` (a strided view into the
  fused QKV output), in place; one program per token.
- ``silu_mul(gate_up) -> silu(gate) * up``.
- ``rope_store_kv(qkv, cos, sin, k_cache, v_cache, slot_mapping)``: the attention input in one launch: rotate
  the query heads of the fused QKV output in place, rotate the key heads and write them with the value heads
  into the paged cache at their slots (a negative slot writes nothing).

Launches per decoder layer in a decode step with these ops (``layer_ops.triton_layer_ops()``) and the Triton
paged attention, counted by ``python -m solutions bench kernels`` on a GPU::

    add_rms_norm | qkv GEMM | rope_store_kv | paged decode (+ split merge) | o_proj GEMM
    add_rms_norm | gate_up GEMM | silu_mul | down GEMM                       = 9, or 10 with a split context

(a GEMM is one cuBLAS kernel, or two where cuBLAS splits K and reduces apart).

All kernels take CUDA tensors (compiled) or CPU tensors (through the interpreter: ``TRITON_INTERPRET=1``,
which ``import solutions`` sets on a machine without a GPU). Inputs need stride 1 in their last dim;
the outputs are new, contiguous tensors, except where a kernel writes in place as documented.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .blocks import cdiv


@triton.jit
def _rounded(x, DTYPE: tl.constexpr):
    """float32 ``x`` rounded to ``DTYPE`` (to nearest, ties to even) and back: where torch rounds a value.
    Every half-precision store goes through it, so the store itself converts exactly. bfloat16 is rounded by
    bit arithmetic: the Triton interpreter's own float32 -> bfloat16 cast truncates."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _add_rms_norm(
    X, Residual, Weight, Normed, NewResidual,
    stride_x, stride_r, stride_n, stride_nr,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program t: token t's row. The sum is rounded to x's dtype before the norm reads it, as ``x + residual``
    is in torch; the norm runs in float32 and is rounded to x's dtype before the weight multiplies it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    x = x.to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(Residual + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        x = _rounded(x + r, X.dtype.element_ty)
        tl.store(NewResidual + row * stride_nr + cols, x, mask=mask)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, 0) / hidden + eps)
    normed = _rounded(x * inv_rms, X.dtype.element_ty)
    w = tl.load(Weight + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Normed + row * stride_n + cols, _rounded(normed * w, Normed.dtype.element_ty), mask=mask)


@triton.jit
def _rotated(a, b, cos_a, cos_b, sin_a, sin_b, DTYPE: tl.constexpr):
    """Rotate-half RoPE of the halves ``a`` (dims ``j``) and ``b`` (dims ``j + D/2``), in float32, rounding to
    ``DTYPE`` where ``x * cos + rotate_half(x) * sin`` does in torch: each product, then the sum."""
    new_a = _rounded(_rounded(a * cos_a, DTYPE) + _rounded(-b * sin_a, DTYPE), DTYPE)
    new_b = _rounded(_rounded(b * cos_b, DTYPE) + _rounded(a * sin_b, DTYPE), DTYPE)
    return new_a, new_b


@triton.jit
def _load_angles(Cos, Sin, t, stride_ct, stride_st, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Token t's cos and sin for both halves of a head, float32 ``[1, BLOCK_HALF]`` each."""
    offs = tl.arange(0, BLOCK_HALF)
    mask = offs < HALF
    cos_a = tl.load(Cos + t * stride_ct + offs, mask=mask, other=0.0).to(tl.float32)
    cos_b = tl.load(Cos + t * stride_ct + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    sin_a = tl.load(Sin + t * stride_st + offs, mask=mask, other=0.0).to(tl.float32)
    sin_b = tl.load(Sin + t * stride_st + HALF + offs, mask=mask, other=0.0).to(tl.float32)
    return cos_a[None, :], cos_b[None, :], sin_a[None, :], sin_b[None, :]


@triton.jit
def _rope(
    QK, Cos, Sin,
    stride_t, stride_h, stride_ct, stride_st,
    heads,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """Program t: every head of token t, rotated in place."""
    t = tl.program_id(0).to(tl.int64)
    cos_a, cos_b, sin_a, sin_b = _load_angles(Cos, Sin, t, stride_ct, stride_st, HALF, BLOCK_HALF)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < heads) & (offs_d[None, :] < HALF)
    ptrs = QK + t * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    a = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
    new_a, new_b = _rotated(a, b, cos_a, cos_b, sin_a, sin_b, QK.dtype.element_ty)
    tl.store(ptrs, new_a, mask=mask)
    tl.store(ptrs + HALF, new_b, mask=mask)


@triton.jit
def _silu_mul(
    GateUp, Out,
    stride_g, stride_o, inter,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (t, j): columns ``[j * BLOCK, (j + 1) * BLOCK)`` of token t. ``F.silu`` rounds to the input
    dtype before the product, which rounds again."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(GateUp + t * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GateUp + t * stride_g + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = _rounded(gate / (1.0 + tl.exp(-gate)), GateUp.dtype.element_ty)
    tl.store(Out + t * stride_o + cols, _rounded(act * up, Out.dtype.element_ty), mask=mask)


@triton.jit
def _rope_store_kv(
    QKV, Cos, Sin, K_cache, V_cache, slot_mapping,
    stride_t, stride_h, stride_ct, stride_st,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    q_heads, kv_heads,
    BLOCK_SIZE: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
):  # fmt: skip
    """Program t: token t's query heads rotated in place; its key heads rotated and, with its value heads,
    written to cache row ``slot_mapping[t]`` (block ``slot // BLOCK_SIZE``, offset ``slot % BLOCK_SIZE``)
    unless the
    slot is negative. The key heads in QKV are left as they were."""
    t = tl.program_id(0).to(tl.int64)
    cos_a, cos_b, sin_a, sin_b = _load_angles(Cos, Sin, t, stride_ct, stride_st, HALF, BLOCK_HALF)
    offs_d = tl.arange(0, BLOCK_HALF)
    row = QKV + t * stride_t

    offs_q = tl.arange(0, BLOCK_HQ)
    mask_q = (offs_q[:, None] < q_heads) & (offs_d[None, :] < HALF)
    q_ptrs = row + offs_q[:, None] * stride_h + offs_d[None, :]
    a = tl.load(q_ptrs, mask=mask_q, other=0.0).to(tl.float32)
    b = tl.load(q_ptrs + HALF, mask=mask_q, other=0.0).to(tl.float32)
    new_a, new_b = _rotated(a, b, cos_a, cos_b, sin_a, sin_b, QKV.dtype.element_ty)
    tl.store(q_ptrs, new_a, mask=mask_q)
    tl.store(q_ptrs + HALF, new_b, mask=mask_q)

    slot = tl.load(slot_mapping + t).to(tl.int64)
    # Names inside the branch are new: a compiled if may not give an outer name a new shape.
    if slot >= 0:
        block = slot // BLOCK_SIZE
        offset = slot % BLOCK_SIZE
        offs_kv = tl.arange(0, BLOCK_HKV)
        mask_kv = (offs_kv[:, None] < kv_heads) & (offs_d[None, :] < HALF)
        k_ptrs = row + (q_heads + offs_kv[:, None]) * stride_h + offs_d[None, :]
        k_a = tl.load(k_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
        k_b = tl.load(k_ptrs + HALF, mask=mask_kv, other=0.0).to(tl.float32)
        rot_a, rot_b = _rotated(k_a, k_b, cos_a, cos_b, sin_a, sin_b, QKV.dtype.element_ty)
        k_dst = (
            K_cache + block * stride_kb + offset * stride_ks + offs_kv[:, None] * stride_kh + offs_d[None, :]
        )
        tl.store(k_dst, _rounded(rot_a, K_cache.dtype.element_ty), mask=mask_kv)
        tl.store(k_dst + HALF, _rounded(rot_b, K_cache.dtype.element_ty), mask=mask_kv)
        v_ptrs = k_ptrs + kv_heads * stride_h
        v_dst = (
            V_cache + block * stride_vb + offset * stride_vs + offs_kv[:, None] * stride_vh + offs_d[None, :]
        )
        v_a = tl.load(v_ptrs, mask=mask_kv, other=0.0).to(tl.float32)
        v_b = tl.load(v_ptrs + HALF, mask=mask_kv, other=0.0).to(tl.float32)
        tl.store(v_dst, _rounded(v_a, V_cache.dtype.element_ty), mask=mask_kv)
        tl.store(v_dst + HALF, _rounded(v_b, V_cache.dtype.element_ty), mask=mask_kv)


def _row_warps(elements: int, device: torch.device) -> int:
    """Warps for a program over ``elements`` values: about 8 per thread on a GPU (one in the interpreter)."""
    if device.type != "cuda":
        return 1
    return min(max(triton.next_power_of_2(elements) // 256, 1), 8)


def _check_rows(name: str, t: torch.Tensor, dims: int) -> None:
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims; got shape {tuple(t.shape)}")
    if t.shape[-1] and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dim; got strides {t.stride()}")


def _check_angles(cos: torch.Tensor, sin: torch.Tensor, tokens: int, head_dim: int) -> None:
    if cos.shape != (tokens, head_dim) or sin.shape != (tokens, head_dim):
        raise ValueError(
            f"cos and sin must be [T, D] = [{tokens}, {head_dim}]; "
            f"got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if head_dim % 2:
        raise ValueError(f"rotate-half RoPE needs an even head dim; got {head_dim}")
    _check_rows("cos", cos, 2)
    _check_rows("sin", sin, 2)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual) * weight, x + residual)`` for x ``[T, hidden]`` in one launch (module doc).

    ``residual`` None normalises x, and the returned stream is x itself. ``normed`` has the dtype of
    ``x.to(dtype) * weight`` in torch (x's, when the weight shares it)."""
    _check_rows("x", x, 2)
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x: x {x.dtype} {tuple(x.shape)}, "
            f"residual {residual.dtype} {tuple(residual.shape)}"
        )
    if residual is not None:
        _check_rows("residual", residual, 2)
    if weight.shape != (x.shape[1],) or weight.stride(0) != 1:
        raise ValueError(f"weight must be a contiguous [{x.shape[1]}] vector; got {tuple(weight.shape)}")
    if len({t.device for t in (x, weight) + ((residual,) if residual is not None else ())}) != 1:
        raise ValueError("x, residual and weight must be on one device")
    tokens, hidden = x.shape
    normed = torch.empty((tokens, hidden), device=x.device, dtype=torch.promote_types(x.dtype, weight.dtype))
    new_residual = x if residual is None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if tokens == 0:
        return normed, new_residual
    source = x if residual is None else residual
    _add_rms_norm[(tokens,)](
        x, source, weight, normed, new_residual,
        x.stride(0), source.stride(0), normed.stride(0), new_residual.stride(0),
        hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(hidden),
        num_warps=_row_warps(hidden, x.device),
    )  # fmt: skip
    return normed, new_residual


def rope(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of every head of ``qk`` ``[T, H, D]`` by its token's ``cos``/``sin`` ``[T, D]``, in
    place (``qk`` may be a strided view with stride 1 in its last dim); returns ``qk``."""
    if qk.dim() != 3:
        raise ValueError(f"qk must be [T, H, D]; got {tuple(qk.shape)}")
    tokens, heads, head_dim = qk.shape
    _check_angles(cos, sin, tokens, head_dim)
    if qk.stride(-1) != 1:
        raise ValueError(f"qk must have stride 1 in its last dim; got strides {qk.stride()}")
    if len({qk.device, cos.device, sin.device}) != 1:
        raise ValueError("qk, cos and sin must be on one device")
    if tokens == 0 or heads == 0:
        return qk
    half = head_dim // 2
    _rope[(tokens,)](
        qk, cos, sin,
        qk.stride(0), qk.stride(1), cos.stride(0), sin.stride(0),
        heads,
        HALF=half, BLOCK_HALF=triton.next_power_of_2(half), BLOCK_H=triton.next_power_of_2(heads),
        num_warps=_row_warps(heads * head_dim, qk.device),
    )  # fmt: skip
    return qk


# Columns per silu_mul program: wide on a GPU; in the interpreter, where each program costs the same, as wide
# as one row.
SILU_BLOCK = 1024


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation on the fused gate/up output ``[T, 2I]``: ``silu(gate) * up``, a new ``[T, I]``."""
    _check_rows("gate_up", gate_up, 2)
    tokens, width = gate_up.shape
    if width % 2:
        raise ValueError(f"gate_up must hold gate and up side by side ([T, 2I]); got width {width}")
    inter = width // 2
    out = torch.empty(tokens, inter, device=gate_up.device, dtype=gate_up.dtype)
    if tokens == 0 or inter == 0:
        return out
    block = SILU_BLOCK if gate_up.is_cuda else triton.next_power_of_2(inter)
    _silu_mul[(tokens, cdiv(inter, block))](
        gate_up, out, gate_up.stride(0), out.stride(0), inter,
        BLOCK=block, num_warps=_row_warps(block, gate_up.device),
    )  # fmt: skip
    return out


def rope_store_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The attention input in one launch, for ``qkv`` ``[T, Hq + 2 Hkv, D]`` (query heads, key heads, value
    heads; ``Hkv`` is the caches' ``[num_blocks, block_size, Hkv, D]``): the query heads are rotated in place,
    the key heads rotated and written with the value heads to cache row ``slot_mapping[t]`` (negative:
    skipped), cast to the cache's dtype. The key heads of ``qkv`` keep their unrotated values. Returns the
    rotated queries, a view ``[T, Hq, D]`` of ``qkv``. Slot values are not checked (on a GPU that would wait
    for the device)."""
    if qkv.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"need qkv [T, Hq + 2 Hkv, D] and caches [num_blocks, block_size, Hkv, D]; "
            f"got qkv {tuple(qkv.shape)}, "
            f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
        )
    tokens, heads, head_dim = qkv.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    q_heads = heads - 2 * kv_heads
    if k_cache.shape[3] != head_dim or q_heads < 1:
        raise ValueError(
            f"qkv {tuple(qkv.shape)} does not hold query heads plus the cache's {kv_heads} key and value "
            f"heads of dim {k_cache.shape[3]}"
        )
    _check_angles(cos, sin, tokens, head_dim)
    if qkv.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("qkv, k_cache and v_cache must have stride 1 in their last dim")
    if slot_mapping.shape != (tokens,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"slot_mapping must be an int32/int64 vector of one slot per token ({tokens}); "
            f"got {slot_mapping.dtype} {tuple(slot_mapping.shape)}"
        )
    if len({t.device for t in (qkv, cos, sin, k_cache, v_cache, slot_mapping)}) != 1:
        raise ValueError("qkv, cos, sin, the caches and slot_mapping must be on one device")
    queries = qkv[:, :q_heads]
    if tokens == 0:
        return queries
    half = head_dim // 2
    _rope_store_kv[(tokens,)](
        qkv, cos, sin, k_cache, v_cache, slot_mapping,
        qkv.stride(0), qkv.stride(1), cos.stride(0), sin.stride(0),
        *k_cache.stride()[:3], *v_cache.stride()[:3],
        q_heads, kv_heads,
        BLOCK_SIZE=block_size, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(q_heads), BLOCK_HKV=triton.next_power_of_2(kv_heads),
        num_warps=_row_warps(heads * head_dim, qkv.device),
    )  # fmt: skip
    return queries
