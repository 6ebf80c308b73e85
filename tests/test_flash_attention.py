"""FlashAttention-2 kernel (Lab 1) against the float64 reference, through the interpreter on CPU."""

from __future__ import annotations

import pytest
import torch

from solutions.kernels.reference import reference_attention

pytestmark = pytest.mark.lab1

# Relative error bounds: fp32 is near exact; half types round P to 8 or 11 mantissa bits before P @ V.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
# (Hq, Hkv, Lq, Lk, D): odd lengths, Lq < Lk (a chunk over a cached prefix), GQA ratio 3, D 64 and 128.
SHAPES = [(3, 1, 19, 19, 64), (3, 1, 7, 37, 64), (2, 2, 17, 17, 128), (3, 3, 1, 21, 32)]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def reference(q, k, v, causal):
    return reference_attention(q.double(), k.double(), v.double(), causal=causal)


@pytest.fixture
def fa(load):
    return load("kernels.flash_attention")


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference(fa, shape, causal, dtype):
    hq, hkv, lq, lk, d = shape
    q = torch.randn(2, hq, lq, d, dtype=dtype)
    k, v = torch.randn(2, 2, hkv, lk, d, dtype=dtype).unbind(0)
    out = fa.flash_attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    assert rel_err(out, reference(q, k, v, causal)) < TOLERANCE[dtype]


def test_lse_and_scale(fa):
    q, k, v = torch.randn(3, 1, 3, 13, 64).unbind(0)
    out, lse = fa.flash_attention(q, k, v, causal=True, sm_scale=0.3, return_lse=True)
    scores = (q.double() @ k.double().transpose(-1, -2)) * 0.3
    scores = scores.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse.double(), scores.logsumexp(-1), atol=1e-5)
    assert rel_err(out, reference_attention(q.double(), k.double(), v.double(), causal=True, sm_scale=0.3)) < 1e-5


def test_varlen_matches_per_sequence(fa):
    lens_q, lens_k = [5, 1, 12], [9, 6, 12]  # the first two are chunks over a cached prefix
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    q = torch.randn(sum(lens_q), 3, 64)
    k, v = torch.randn(2, sum(lens_k), 1, 64).unbind(0)
    out = fa.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), causal=True)
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        as4d = lambda t: t.transpose(0, 1)[None]
        ref = reference(as4d(q[qs]), as4d(k[ks]), as4d(v[ks]), True)[0].transpose(0, 1)
        assert rel_err(out[qs], ref) < 1e-5


def test_online_softmax_update_matches_softmax(fa):
    s, v = torch.randn(4, 24, dtype=torch.float64), torch.randn(24, 8, dtype=torch.float64)
    s[0, :8] = float("-inf")  # a row whose first block is fully masked
    m, denom, acc = (
        torch.full((4,), float("-inf"), dtype=torch.float64),
        torch.zeros(4, dtype=torch.float64),
        torch.zeros(4, 8, dtype=torch.float64),
    )
    for start in range(0, 24, 8):
        m, denom, acc = fa.online_softmax_update(m, denom, acc, s[:, start : start + 8], v[start : start + 8])
    assert torch.allclose(acc / denom[:, None], torch.softmax(s, -1) @ v)


def test_poisoned_output_is_overwritten(fa, monkeypatch):
    # Every output row, including those past a tile edge, must be written: NaN-filled buffers expose misses.
    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real_empty_like(t, **kw).fill_(float("nan")))
    q, k, v = torch.randn(3, 1, 3, 17, 64).unbind(0)
    out = fa.flash_attention(q, k, v, causal=True)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "q_shape, k_shape, dtypes, match",
    [
        ((1, 3, 4, 64), (1, 2, 4, 64), None, "multiple"),
        ((1, 3, 4, 64), (1, 1, 4, 32), None, "head dim"),
        ((1, 2, 4, 48), (1, 2, 4, 48), None, "32, 64 or 128"),
        ((1, 3, 4, 64), (1, 1, 4, 64), (torch.float32, torch.float16), "dtype"),
        ((3, 4, 64), (1, 4, 64), None, "4-D"),
    ],
)
def test_clear_errors(fa, q_shape, k_shape, dtypes, match):
    q = torch.randn(q_shape, dtype=dtypes[0] if dtypes else torch.float32)
    k = torch.randn(k_shape, dtype=dtypes[1] if dtypes else torch.float32)
    with pytest.raises(ValueError, match=match):
        fa.flash_attention(q, k, k, causal=False)


@pytest.mark.slow
def test_model_logits_triton_equal_torch(load, llm, monkeypatch):
    """The model on the Triton kernel gives the torch backend's logits; the engine's prefill uses it too."""
    backend = load("kernels.attention_backend")
    model = llm.engine.model
    ids = torch.tensor(llm.tokenizer.encode("The capital of France is"))
    positions = torch.arange(len(ids))

    def attend_with(name):
        def attend(layer, q, k, v):
            heads_first = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            return backend.prefill_attention(*heads_first, causal=True, backend=name)[0].transpose(0, 1)

        return attend

    with torch.inference_mode():
        ours = model.logits(model(ids, positions, attend_with("triton")))
        theirs = model.logits(model(ids, positions, attend_with("torch")))
    assert rel_err(ours, theirs.double()) < 1e-4

    params = load("engine.sampling_params").SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    monkeypatch.setenv("FASTMODE_ATTENTION", "triton")
    via_triton = llm.generate("The capital of France is", params)[0].outputs[0].token_ids
    monkeypatch.setenv("FASTMODE_ATTENTION", "torch")
    assert via_triton == llm.generate("The capital of France is", params)[0].outputs[0].token_ids


def test_engine_option_selects_the_triton_prefill(monkeypatch):
    """``LLM(attention_backend="triton")`` reaches the kernel through the runner, not only the env var."""
    from solutions import LLM, SamplingParams
    from solutions.kernels import flash_attention as module

    monkeypatch.delenv("FASTMODE_ATTENTION", raising=False)
    calls = []
    real = module.flash_attention
    monkeypatch.setattr(module, "flash_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    LLM(device="cpu", attention_backend="triton", max_model_len=64).generate(
        "Hello there, friend", SamplingParams(max_tokens=2)
    )
    assert len(calls) == 30  # one prefill call per layer
