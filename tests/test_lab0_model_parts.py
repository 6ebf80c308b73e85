"""Lab 0: the model's RMSNorm, RoPE and grouped-query attention, against float64 references."""

from __future__ import annotations

import pytest
import torch

from solutions.kernels.reference import reference_attention

pytestmark = pytest.mark.lab0


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double() - expected).norm() / expected.norm())


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_rms_norm_matches_float64(load, dtype, tol):
    llama = load("model.llama")
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 576, generator=gen) * 3).to(dtype)
    weight = torch.randn(576, generator=gen).to(dtype)
    x64 = x.double()
    expected = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    out = llama.rms_norm(x, weight, 1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert rel_err(out, expected) < tol


def test_rope_rotates_each_pair_by_its_angle(load):
    """Reference: pair (j, j + D/2) as a complex number, multiplied by exp(i * pos * theta^(-2j/D))."""
    llama = load("model.llama")
    head_dim, theta = 64, 100000.0
    cos, sin = llama.rope_tables(head_dim, theta, 512)
    positions = torch.tensor([0, 1, 5, 130, 511])
    x = torch.randn(len(positions), 3, head_dim, dtype=torch.float32)
    out = llama.apply_rope(x, cos[positions], sin[positions])

    x64 = x.double()
    pairs = torch.complex(x64[..., : head_dim // 2], x64[..., head_dim // 2 :])
    freqs = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    rotation = torch.polar(torch.ones_like(freqs), positions.double()[:, None] * freqs)  # [T, D/2]
    rotated = pairs * rotation[:, None, :]
    expected = torch.cat([rotated.real, rotated.imag], dim=-1)
    assert rel_err(out, expected) < 1e-5
    # Position 0 is the identity; rotation preserves each head's norm.
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)


CASES = [
    # batch, q_heads, kv_heads, q_len, k_len, head_dim, causal
    (1, 9, 3, 1, 37, 64, False),  # SmolLM2 decode: GQA ratio 3
    (2, 9, 3, 13, 13, 64, True),  # prefill, odd length
    (1, 6, 2, 5, 21, 128, True),  # a chunk of queries over a longer cached prefix
    (3, 4, 4, 7, 9, 32, False),  # plain multi-head attention
    (2, 8, 1, 3, 3, 64, True),  # multi-query attention
]


@pytest.mark.parametrize("batch, q_heads, kv_heads, q_len, k_len, head_dim, causal", CASES)
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_gqa_attention_matches_float64(load, batch, q_heads, kv_heads, q_len, k_len, head_dim, causal, dtype, tol):
    attention = load("kernels.attention")
    gen = torch.Generator().manual_seed(batch * 100 + q_len)
    q = torch.randn(batch, q_heads, q_len, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, kv_heads, k_len, head_dim, generator=gen).to(dtype)
    out = attention.gqa_attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, reference_attention(q, k, v, causal=causal)) < tol


def test_gqa_attention_masks_padded_keys(load):
    """Sequences of different lengths padded into one decode batch: padding must not leak in."""
    attention = load("kernels.attention")
    q = torch.randn(3, 9, 1, 64)
    k, v = torch.randn(3, 3, 20, 64), torch.randn(3, 3, 20, 64)
    kv_lens = torch.tensor([20, 4, 11])
    out = attention.gqa_attention(q, k, v, causal=False, kv_lens=kv_lens)
    assert rel_err(out, reference_attention(q, k, v, causal=False, kv_lens=kv_lens)) < 1e-5
    k_poisoned = k.clone()
    k_poisoned[1, :, 4:] = 1e4
    torch.testing.assert_close(attention.gqa_attention(q, k_poisoned, v, causal=False, kv_lens=kv_lens), out)


def test_gqa_attention_uses_sm_scale(load):
    attention = load("kernels.attention")
    q, k, v = torch.randn(1, 2, 4, 32), torch.randn(1, 2, 6, 32), torch.randn(1, 2, 6, 32)
    out = attention.gqa_attention(q, k, v, causal=True, sm_scale=0.3)
    assert rel_err(out, reference_attention(q, k, v, causal=True, sm_scale=0.3)) < 1e-5
