"""Lab 0: the model's RMSNorm, RoPE and grouped-query attention, against float64 references.

Each check names what it tried and the likely cause when it fails (`make grade LAB=0`).
"""

from __future__ import annotations

import pytest
import torch

from solutions.kernels.reference import reference_attention

pytestmark = pytest.mark.lab0

DTYPES = [pytest.param(torch.float32, 1e-6, id="fp32"), pytest.param(torch.bfloat16, 1e-2, id="bf16")]


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected).norm() / expected.norm())


def expect_close(actual: torch.Tensor, expected: torch.Tensor, tol: float, what: str, likely: str) -> None:
    """Fail with the relative error, what was tried, and the likely cause (never a dump of the tensors)."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if not torch.isfinite(actual).all():
        bad = int((~torch.isfinite(actual)).sum())
        raise AssertionError(f"{what}: {bad} of {actual.numel()} outputs are inf or NaN. Likely: {likely}")
    err = rel_err(actual, expected)
    if not err < tol:
        raise AssertionError(f"{what}: relative error {err:.3g}, needs < {tol:g}. Likely: {likely}")


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


@pytest.mark.parametrize("dtype, tol", DTYPES)
def test_rms_norm_matches_float64(load, dtype, tol):
    llama = load("model.llama")
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    out = llama.rms_norm(x, weight, 1e-5)
    assert out.dtype == dtype, (
        f"rms_norm returned {out.dtype} for {dtype} input: cast the result back to x's dtype"
    )
    expect_close(
        out,
        rms_norm_reference(x, weight, 1e-5),
        tol,
        f"rms_norm on {dtype}",
        "divide by sqrt(mean(x**2) + eps) over the LAST dim (keepdim=True), then multiply by weight",
    )


def test_rms_norm_upcasts_float16(load):
    """Activations near 300 in float16: their squares (about 90000) overflow float16,
    whose largest value is 65504."""
    llama = load("model.llama")
    gen = torch.Generator().manual_seed(1)
    x = (300 + 20 * torch.randn(4, 576, generator=gen)).half()
    weight = (1 + 0.1 * torch.randn(576, generator=gen)).half()
    out = llama.rms_norm(x, weight, 1e-5)
    assert out.dtype == torch.float16, (
        f"rms_norm returned {out.dtype} for float16 input: cast back to x's dtype"
    )
    expect_close(
        out,
        rms_norm_reference(x, weight, 1e-5),
        1e-3,
        "rms_norm on float16 activations near 300",
        "x**2 overflowed float16 (max 65504) to inf, so x / sqrt(inf) became 0: "
        "compute in float32 (x.float()) and cast the result back",
    )


def test_rms_norm_uses_eps(load):
    """A row of zeros must give zeros (eps keeps 0 / 0 away), and eps must sit inside the square root."""
    llama = load("model.llama")
    x = torch.zeros(3, 64)
    x[1] = 1e-3 * torch.randn(64, generator=torch.Generator().manual_seed(2))  # mean(x**2) ~ 1e-6, below eps
    weight = torch.ones(64)
    out = llama.rms_norm(x, weight, 1e-5)
    finite = bool(torch.isfinite(out).all())
    assert finite, "rms_norm of a row of zeros gave NaN (0 / 0): add eps to mean(x**2) before sqrt"
    zero_row = float(out[0].abs().max())
    assert zero_row == 0, f"rms_norm of a row of zeros must be zeros; got values up to {zero_row:.3g}"
    expect_close(
        out[1:2],
        rms_norm_reference(x[1:2], weight, 1e-5),
        1e-5,
        "rms_norm of a tiny row (mean(x**2) about 1e-6, eps 1e-5)",
        "eps belongs inside the root: x / sqrt(mean(x**2) + eps), not x / (sqrt(mean(x**2)) + eps)",
    )


def test_rope_rotates_each_pair_by_its_angle(load):
    """Reference: pair (j, j + D/2) as a complex number, multiplied by exp(i * pos * theta^(-2j/D))."""
    llama = load("model.llama")
    head_dim, theta = 64, 100000.0
    cos, sin = llama.rope_tables(head_dim, theta, 512)
    positions = torch.tensor([0, 1, 5, 130, 511])
    x = torch.randn(len(positions), 3, head_dim, generator=torch.Generator().manual_seed(3))
    out = llama.apply_rope(x, cos[positions], sin[positions])

    moved = float((out[0] - x[0]).abs().max())
    assert moved < 1e-6, f"position 0 must be left unchanged (cos 1, sin 0); it moved by up to {moved:.3g}"
    norms = float((out.norm(dim=-1) - x.norm(dim=-1)).abs().max())
    assert norms < 1e-4, (
        f"a rotation keeps each head's length; it changed by up to {norms:.3g}: check the signs"
    )
    x64 = x.double()
    pairs = torch.complex(x64[..., : head_dim // 2], x64[..., head_dim // 2 :])
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotation = torch.polar(torch.ones_like(freqs), positions.double()[:, None] * freqs)  # [T, D/2]
    rotated = pairs * rotation[:, None, :]
    expected = torch.cat([rotated.real, rotated.imag], dim=-1)
    expect_close(
        out,
        expected,
        1e-5,
        "apply_rope at positions 0, 1, 5, 130, 511",
        "dimension j pairs with j + D/2 (rotate-half, not adjacent pairs 2j, 2j+1); "
        "the first half gets a*cos - b*sin, the second b*cos + a*sin",
    )


Q_HEAD_TO_KV = "query head h reads K/V head h // (Hq // Hkv): heads 0-2 share K/V head 0, 3-5 head 1, ..."
CASES = [
    # batch, q_heads, kv_heads, q_len, k_len, head_dim, causal, the likely mistake when this case fails
    pytest.param(1, 9, 3, 1, 37, 64, False, Q_HEAD_TO_KV, id="decode-9q-3kv"),  # SmolLM2 decode: GQA ratio 3
    pytest.param(
        2, 9, 3, 13, 13, 64, True, "causal: query i sees keys j <= i, -inf elsewhere", id="prefill-causal"
    ),
    pytest.param(
        1,
        6,
        2,
        5,
        21,
        128,
        True,
        "causal is bottom-right when Lq < Lk: query i sees j <= i + (Lk - Lq)",
        id="chunk-causal",
    ),
    pytest.param(
        3,
        4,
        4,
        7,
        9,
        32,
        False,
        "scores = q k^T * head_dim**-0.5, softmax over keys, times v",
        id="multihead",
    ),
    pytest.param(2, 8, 1, 3, 3, 64, True, "one K/V head serves every query head", id="multiquery-causal"),
]


@pytest.mark.parametrize("batch, q_heads, kv_heads, q_len, k_len, head_dim, causal, likely", CASES)
@pytest.mark.parametrize(
    "dtype, tol",
    [pytest.param(torch.float32, 1e-5, id="fp32"), pytest.param(torch.bfloat16, 2e-2, id="bf16")],
)
def test_gqa_attention_matches_float64(
    load, batch, q_heads, kv_heads, q_len, k_len, head_dim, causal, likely, dtype, tol
):
    attention = load("kernels.attention")
    gen = torch.Generator().manual_seed(batch * 100 + q_len)
    q = torch.randn(batch, q_heads, q_len, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen).to(dtype)
    out = attention.gqa_attention(q, k, v, causal=causal)
    assert out.dtype == dtype, (
        f"gqa_attention returned {out.dtype} for {dtype} inputs: cast the result to q's dtype"
    )
    expect_close(
        out,
        reference_attention(q, k, v, causal=causal),
        tol,
        f"gqa_attention, q {tuple(q.shape)}, k {tuple(k.shape)}, causal={causal}, {dtype}",
        likely,
    )


def test_gqa_attention_masks_padded_keys(load):
    """Sequences of different lengths padded into one decode batch: padding must not leak in."""
    attention = load("kernels.attention")
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(3, 9, 1, 64, generator=gen)
    k, v = torch.randn(3, 3, 20, 64, generator=gen), torch.randn(3, 3, 20, 64, generator=gen)
    kv_lens = torch.tensor([20, 4, 11])
    out = attention.gqa_attention(q, k, v, causal=False, kv_lens=kv_lens)
    expect_close(
        out,
        reference_attention(q, k, v, causal=False, kv_lens=kv_lens),
        1e-5,
        "gqa_attention with kv_lens [20, 4, 11]",
        "keys at j >= kv_lens[b] are padding: mask them to -inf",
    )
    k_poisoned = k.clone()
    k_poisoned[1, :, 4:] = 1e4
    changed = float(
        (attention.gqa_attention(q, k_poisoned, v, causal=False, kv_lens=kv_lens) - out).abs().max()
    )
    assert changed < 1e-5, f"changing padded keys (past kv_lens) moved the output by {changed:.3g}: mask them"


def test_gqa_attention_uses_sm_scale(load):
    attention = load("kernels.attention")
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 32, generator=gen) for n in (4, 6, 6))
    expect_close(
        attention.gqa_attention(q, k, v, causal=True, sm_scale=0.3),
        reference_attention(q, k, v, causal=True, sm_scale=0.3),
        1e-5,
        "gqa_attention with sm_scale=0.3",
        "use sm_scale when it is given, head_dim**-0.5 only when it is None",
    )


def test_rms_norm_normalises_the_last_dim_of_any_rank(load):
    """[T, H, D] as well as [T, hidden]: the statistic is over the last dimension whatever comes before it."""
    llama = load("model.llama")
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, 64, generator=gen) * 2
    weight = torch.randn(64, generator=gen)
    expect_close(
        llama.rms_norm(x, weight, 1e-5),
        rms_norm_reference(x, weight, 1e-5),
        1e-5,
        "rms_norm on a [2, 5, 64] input",
        "the mean of x**2 is over the LAST dim (dim=-1, keepdim=True), not dim=1: the same line must work "
        "for [T, hidden] and for [T, heads, head_dim]",
    )


def test_rope_keeps_bfloat16_with_the_models_tables(load):
    """The model holds its cos/sin tables in its own dtype (``LlamaModel.from_weights`` casts them), so a
    bfloat16 model rotates bfloat16 q and k by bfloat16 tables, and what comes out must stay bfloat16."""
    llama = load("model.llama")
    head_dim, theta = 64, 100000.0
    cos, sin = (t.to(torch.bfloat16) for t in llama.rope_tables(head_dim, theta, 64))
    positions = torch.tensor([0, 3, 17, 63])
    x = torch.randn(len(positions), 3, head_dim, generator=torch.Generator().manual_seed(7))
    out = llama.apply_rope(x.to(torch.bfloat16), cos[positions], sin[positions])
    assert out.dtype == torch.bfloat16, (
        f"apply_rope returned {out.dtype} for bfloat16 q/k and bfloat16 tables (a bfloat16 model's): the "
        "next matmul would mix dtypes. Return x's dtype (cast back if you rotated in float32)"
    )
    cos64, sin64 = (t.double() for t in llama.rope_tables(head_dim, theta, 64))
    half = head_dim // 2
    x64 = x.to(torch.bfloat16).double()
    rotated = torch.cat([-x64[..., half:], x64[..., :half]], dim=-1)
    expected = x64 * cos64[positions][:, None] + rotated * sin64[positions][:, None]
    expect_close(
        out,
        expected,
        2e-2,
        "apply_rope on bfloat16 q/k",
        "rotate-half: x * cos + rotate_half(x) * sin, cos and sin broadcast over the head axis",
    )


def test_gqa_attention_causal_over_padded_keys_aligns_each_sequence(load):
    """A batched chunk of 3 queries over sequences of 9 and 5 keys padded to 9: the causal mask is
    bottom-right for each sequence's own length: query i of sequence b sees keys j <= i + kv_lens[b] - Lq."""
    attention = load("kernels.attention")
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(2, 6, 3, 32, generator=gen)
    k, v = torch.randn(2, 2, 9, 32, generator=gen), torch.randn(2, 2, 9, 32, generator=gen)
    kv_lens = torch.tensor([9, 5])
    expect_close(
        attention.gqa_attention(q, k, v, causal=True, kv_lens=kv_lens),
        reference_attention(q, k, v, causal=True, kv_lens=kv_lens),
        1e-5,
        "gqa_attention, causal, 3 queries over kv_lens [9, 5] padded to 9 keys",
        "with kv_lens the causal shift is per sequence: query i sees keys j <= i + (kv_lens[b] - Lq), "
        "not i + (Lk - Lq), which lets a short sequence's queries see keys after their own position",
    )
