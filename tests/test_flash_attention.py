"""FlashAttention-2 kernel (Lab 1) against the float64 reference: compiled on a GPU, through the Triton
interpreter on CPU (``kernel_device.KERNEL_DEVICE``).

Each check names what it tried and the likely cause when it fails (`make grade LAB=1`).
"""

from __future__ import annotations

import pytest
import torch
from kernel_device import KERNEL_DEVICE

from solutions.kernels.reference import reference_attention

pytestmark = pytest.mark.lab1

# Relative error bounds: fp32 is near exact on both devices (its tl.dot runs in IEEE float32, not TF32); half
# types round P to 8 or 11 mantissa bits before P @ V.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
# (Hq, Hkv, Lq, Lk, D): odd lengths, Lq < Lk (a chunk over a cached prefix), GQA ratio 3, D 64 and 128.
SHAPES = [
    pytest.param((3, 1, 19, 19, 64), id="gqa3-19x19"),
    pytest.param((3, 1, 7, 37, 64), id="gqa3-chunk-7-over-37"),
    pytest.param((2, 2, 17, 17, 128), id="mha-d128"),
    pytest.param((3, 3, 1, 21, 32), id="decode-1-over-21"),
    pytest.param((4, 2, 13, 29, 16), id="gqa2-d16"),
]
DTYPES = [pytest.param(dtype, id=str(dtype).removeprefix("torch.")) for dtype in TOLERANCE]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double().cpu(), ref.double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def expect_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str, likely: str) -> None:
    """Fail with the relative error, what was tried and the likely cause (never a dump of the tensors)."""
    if not torch.isfinite(out).all():
        bad = int((~torch.isfinite(out)).sum())
        raise AssertionError(
            f"{what}: {bad} of {out.numel()} outputs are inf or NaN. Likely: a fully masked row or block "
            "(m stays -inf, and exp(-inf - -inf) is NaN: subtract 0 where the max is -inf), or a load "
            "past the sequence end without mask=... and other=0.0"
        )
    err = rel_err(out, ref)
    if not err < tol:
        raise AssertionError(f"{what}: relative error {err:.3g}, needs < {tol:g}. Likely: {likely}")


def reference(q, k, v, causal):
    return reference_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), causal=causal)


def on_device(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(KERNEL_DEVICE) for t in tensors)


@pytest.fixture
def fa(load):
    return load("kernels.flash_attention")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [pytest.param(False, id="full"), pytest.param(True, id="causal")])
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_reference(fa, shape, causal, dtype):
    hq, hkv, lq, lk, d = shape
    gen = torch.Generator().manual_seed(lq * 100 + lk)
    q = torch.randn(2, hq, lq, d, generator=gen).to(dtype)
    k, v = torch.randn(2, 2, hkv, lk, d, generator=gen).to(dtype).unbind(0)
    q, k, v = on_device(q, k, v)
    out = fa.flash_attention(q, k, v, causal=causal)
    assert out.shape == q.shape and out.dtype == dtype
    likely = (
        "the causal mask: query i sees keys j <= i + (Lk - Lq) (offs_m + shift); the loop stops at hi"
        if causal
        else "the loop over key blocks (every block up to hi, each K and V tile masked past k_len), "
        "or the rescaling by exp2(m_old - m_new) in _online_softmax_step"
    )
    if dtype == torch.float32 and KERNEL_DEVICE.type == "cuda":
        likely += "; in float32 on a GPU, a tl.dot left at its TF32 default: _dot keeps IEEE float32"
    expect_close(
        out, reference(q, k, v, causal), TOLERANCE[dtype], f"q {tuple(q.shape)}, k {tuple(k.shape)}", likely
    )


def test_lse_and_scale(fa):
    q, k, v = torch.randn(3, 1, 3, 13, 64).unbind(0)
    out, lse = fa.flash_attention(*on_device(q, k, v), causal=True, sm_scale=0.3, return_lse=True)
    scores = (q.double() @ k.double().transpose(-1, -2)) * 0.3
    scores = scores.masked_fill(torch.ones(13, 13, dtype=torch.bool).triu(1), float("-inf"))
    lse_err = (lse.double().cpu() - scores.logsumexp(-1)).abs().max().item()
    assert lse_err < 1e-5, f"LSE off by up to {lse_err:.3g}: it is m + log2(l) in base 2, divided by log2(e)"
    expect_close(
        out,
        reference_attention(q.double(), k.double(), v.double(), causal=True, sm_scale=0.3),
        1e-5,
        "sm_scale=0.3",
        "scores are q k^T * qk_scale, with qk_scale = sm_scale * log2(e)",
    )


def test_varlen_matches_per_sequence(fa):
    lens_q, lens_k = [5, 1, 12], [9, 6, 12]  # the first two are chunks over a cached prefix
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    q = torch.randn(sum(lens_q), 3, 64)
    k, v = torch.randn(2, sum(lens_k), 1, 64).unbind(0)
    out = fa.flash_attention_varlen(*on_device(q, k, v, cu_q, cu_k), max(lens_q), causal=True).cpu()
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        as4d = lambda t: t.transpose(0, 1)[None]
        ref = reference(as4d(q[qs]), as4d(k[ks]), as4d(v[ks]), True)[0].transpose(0, 1)
        expect_close(
            out[qs],
            ref,
            1e-5,
            f"varlen sequence {b} ({lens_q[b]} queries over {lens_k[b]} keys)",
            "each sequence's own q_len and k_len bound the loop and the masks, not the batch's",
        )


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
        if not torch.isfinite(acc).all() or not torch.isfinite(denom).all():
            raise AssertionError(
                f"after keys 0..{start + 7}, acc or denom holds NaN. Row 0's first block is fully masked "
                "(all -inf), so its max stays -inf and exp(-inf - (-inf)) = NaN: where the new max is "
                "-inf, subtract 0 instead"
            )
    got = acc / denom[:, None]
    err = (got - torch.softmax(s, -1) @ v).abs().max().item()
    assert err < 1e-10, (
        f"acc / denom differs from softmax(s) @ v by {err:.3g}. Likely: denom and acc must be rescaled by "
        "exp(m_old - m_new) before this block's exp(s - m_new) terms are added"
    )


def test_poisoned_output_is_overwritten(fa, monkeypatch):
    # Every output row, including those past a tile edge, must be written: NaN-filled buffers expose misses.
    real_empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t, **kw: real_empty_like(t, **kw).fill_(float("nan")))
    q, k, v = on_device(*torch.randn(3, 1, 3, 17, 64).unbind(0))
    out = fa.flash_attention(q, k, v, causal=True)
    missed = int((~torch.isfinite(out)).sum())
    assert missed == 0, f"{missed} outputs still NaN: rows past a tile edge or masked scores were not handled"


@pytest.mark.parametrize(
    "q_shape, k_shape, dtypes, match",
    [
        pytest.param((1, 3, 4, 64), (1, 2, 4, 64), None, "multiple", id="heads-not-multiple"),
        pytest.param((1, 3, 4, 64), (1, 1, 4, 32), None, "head dim", id="head-dims-differ"),
        pytest.param((1, 2, 4, 48), (1, 2, 4, 48), None, "one of 16, 32, 64, 128; got 48", id="head-dim-48"),
        pytest.param(
            (1, 3, 4, 64), (1, 1, 4, 64), (torch.float32, torch.float16), "dtype", id="mixed-dtypes"
        ),
        pytest.param((3, 4, 64), (1, 4, 64), None, "4-D", id="3d-input"),
    ],
)
def test_clear_errors(fa, q_shape, k_shape, dtypes, match):
    q = torch.randn(q_shape, dtype=dtypes[0] if dtypes else torch.float32, device=KERNEL_DEVICE)
    k = torch.randn(k_shape, dtype=dtypes[1] if dtypes else torch.float32, device=KERNEL_DEVICE)
    with pytest.raises(ValueError, match=match):
        fa.flash_attention(q, k, k, causal=False)


@pytest.mark.slow
@pytest.mark.interpreter  # the CPU engine's tensors through the Triton kernel
def test_model_logits_triton_equal_torch(load, llm, monkeypatch):
    """The model on the Triton kernel gives the torch backend's logits; the engine's prefill uses it too.

    The prompt spans several 16-row tiles (the CPU block size), so the kernel's loop over key blocks, the
    rescaling between blocks and the causal diagonal tiles all run inside the real model.
    """
    backend = load("kernels.attention_backend")
    model = llm.engine.model
    prompt = "FlashAttention never stores the score matrix: it walks over blocks of keys, " * 3
    ids = torch.tensor(llm.tokenizer.encode(prompt))
    assert len(ids) > 2 * 16
    positions = torch.arange(len(ids))

    def attend_with(name):
        def attend(layer, q, k, v):
            heads_first = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
            return backend.prefill_attention(*heads_first, causal=True, backend=name)[0].transpose(0, 1)

        return attend

    with torch.inference_mode():
        ours = model.logits(model(ids, positions, attend_with("triton")))
        theirs = model.logits(model(ids, positions, attend_with("torch")))
    expect_close(
        ours,
        theirs.double(),
        1e-4,
        f"SmolLM2 logits on a {len(ids)}-token prompt, Triton prefill vs torch",
        "a tile-boundary case the small tests missed: the causal diagonal or the rescaling across key blocks",
    )

    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    monkeypatch.setenv("FASTMODE_ATTENTION", "triton")
    via_triton = llm.generate("The capital of France is", params)[0].outputs[0].token_ids
    monkeypatch.setenv("FASTMODE_ATTENTION", "torch")
    assert via_triton == llm.generate("The capital of France is", params)[0].outputs[0].token_ids


@pytest.mark.interpreter  # a CPU engine on the Triton kernels
@pytest.mark.needs_model
def test_engine_option_selects_the_triton_kernels(load, fa, monkeypatch):
    """``LLM(attention_backend="triton")`` runs the paged Triton kernel,
    built on the online-softmax step under test."""
    paged = load("kernels.paged_attention")
    assert paged._online_softmax_step is fa._online_softmax_step, "the paged kernel must use Lab 1's step"
    monkeypatch.delenv("FASTMODE_ATTENTION", raising=False)
    calls = []
    real = paged.paged_attention
    # Spied where the engine looks it up: the paged cache's module imported the name.
    monkeypatch.setattr(
        load("cache.paged_kv_cache"), "paged_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    llm = load("llm").LLM(device="cpu", attention_backend="triton", max_model_len=64)
    llm.generate("Hello there, friend", load("sampling_params").SamplingParams(max_tokens=2))
    assert calls and len(calls) % 30 == 0, (
        f"the Triton kernel ran {len(calls)} times; one call per layer and step"
    )


def test_bench_attention_smoke(load, capsys):
    """``bench attention --smoke`` runs the GPU table's code on tiny shapes (interpreter on a CPU)."""
    assert load("cli.bench.attention").main(["--smoke"]) == 0
    assert "ours/sdpa" in capsys.readouterr().out


def test_an_engine_on_cuda_takes_torch_attention_for_a_head_dim_the_kernels_do_not_tile(load, monkeypatch):
    """ "auto" keeps the Triton kernels for the head dims they tile; for another (96, say) a CUDA engine runs
    torch's attention (and so no decode graphs) instead of failing; a backend named outright stays."""
    backend_for_model = load("kernels.attention_backend").backend_for_model
    monkeypatch.delenv("FASTMODE_ATTENTION", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # a device object needs no GPU
    assert backend_for_model("auto", cuda, 64) == "auto"
    assert backend_for_model("auto", cuda, 96) == "torch"
    assert backend_for_model("triton", cuda, 96) == "triton"
    assert backend_for_model("auto", cpu, 96) == "auto"
    monkeypatch.setenv("FASTMODE_ATTENTION", "triton")
    assert backend_for_model("auto", cuda, 96) == "auto", (
        "an explicit $FASTMODE_ATTENTION is the user's choice"
    )


def test_online_softmax_update_keeps_large_float32_scores_finite(fa):
    """Scores near 120 in float32, as sharp attention heads give: exp(120) is about 1e52, past float32's
    3.4e38, so every exponent must be taken relative to the running max, from the very first block on."""
    gen = torch.Generator().manual_seed(9)
    s = torch.randn(4, 24, generator=gen) * 3 + 120
    v = torch.randn(24, 8, generator=gen)
    m, denom, acc = torch.full((4,), float("-inf")), torch.zeros(4), torch.zeros(4, 8)
    for start in range(0, 24, 8):
        m, denom, acc = fa.online_softmax_update(m, denom, acc, s[:, start : start + 8], v[start : start + 8])
    got = acc / denom[:, None]
    finite = bool(torch.isfinite(got).all())
    assert finite, (
        "acc / denom is inf or NaN for float32 scores near 120. Likely: the first block's exponents were "
        "taken against 0, not against its max: exp(120) overflows float32 (max 3.4e38). The -inf guard "
        "replaces the NEW max m' = max(m, rowmax(s)) only where m' itself is -inf, not wherever the old m is"
    )
    err = (got.double() - torch.softmax(s.double(), -1) @ v.double()).abs().max().item()
    assert err < 1e-5, f"acc / denom differs from softmax(s) @ v by {err:.3g} for float32 scores near 120"


def test_rows_that_see_no_key_come_out_zero(fa):
    """Causal with more queries than keys (20 over 5): rows 0-14 see no key at all, in every block, and must
    output 0 (a softmax row with no mass); the kernel's own update needs the same -inf guard as the torch
    one."""
    q = torch.randn(1, 2, 20, 32, generator=torch.Generator().manual_seed(10))
    k, v = torch.randn(2, 1, 2, 5, 32, generator=torch.Generator().manual_seed(11)).unbind(0)
    out = fa.flash_attention(*on_device(q, k, v), causal=True).cpu()
    bad = int((~torch.isfinite(out)).sum())
    assert bad == 0, (
        f"{bad} of {out.numel()} outputs are NaN for causal 20 queries over 5 keys, where rows 0-14 see no "
        "key. Likely: _online_softmax_step lacks the -inf guard in one of its exponents: a row whose every "
        "score so far is -inf has m_new = -inf, and exp2(-inf - -inf) is NaN; both p = exp2(s - m) and the "
        "rescale alpha = exp2(m_i - m) must subtract m_safe (0 where m_new is -inf, tl.where)"
    )
    expect_close(out, reference(q, k, v, True), 1e-5, "causal, 20 queries over 5 keys", "rows 0-14 output 0")
