"""Fused Triton kernels (``kernels/fused_ops.py``) against float64 references and against ``PLAIN_OPS``,
compiled on a GPU and through the Triton interpreter on CPU; then a tiny random Llama run with the fused set
against the plain one.

Shapes are awkward on purpose (hidden sizes that are no power of two, odd token counts, GQA ratio 3), outputs
are poisoned with NaN before each call so an unwritten element shows, and cache rows a token must not touch
stay NaN.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from kernel_device import KERNEL_DEVICE
from tiny_models import random_llama

from solutions.model.config import ModelConfig
from solutions.model.layer_ops import select_layer_ops, triton_layer_ops
from solutions.model.llama import PLAIN_OPS, LlamaModel, add_rms_norm, apply_rope

# Relative error bounds against float64: float32 differs only by the order of its sums and the last bit of
# rsqrt / exp; half types round where torch rounds (at most one unit in the last place of 8 or 11 mantissa
# bits).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}
DTYPES = [pytest.param(dtype, id=str(dtype).removeprefix("torch.")) for dtype in TOLERANCE]


@pytest.fixture(scope="module")
def fused():
    from solutions.kernels import fused_ops  # late: conftest has decided TRITON_INTERPRET

    return fused_ops


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()).item()


def expect_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str) -> None:
    bad = int((~torch.isfinite(out)).sum())
    assert bad == 0, f"{what}: {bad} of {out.numel()} outputs are NaN/inf (an element left unwritten?)"
    error = rel_err(out, ref)
    assert error < tol, f"{what}: relative error {error:.2e}, needs < {tol:g}"


def expect_like_plain(out: torch.Tensor, plain: torch.Tensor, likely: str) -> None:
    """Half types: nearly every element bit-identical to PLAIN_OPS' (rounded where torch rounds); float32:
    equal up to the order of sums and the last bit of rsqrt / exp."""
    if out.dtype == torch.float32:
        error = rel_err(out, plain)
        assert error < 1e-6, f"relative error {error:.2e} against PLAIN_OPS in float32. Likely: {likely}"
        return
    share = (out.cpu() == plain.cpu()).float().mean().item()
    assert share > 0.98, f"only {share:.1%} of the outputs equal PLAIN_OPS' bit for bit. Likely: {likely}"


def poison_allocations(monkeypatch) -> None:
    """New float tensors start as NaN, so an element a kernel forgets to write shows in the output."""
    for name in ("empty", "empty_like"):
        real = getattr(torch, name)

        def allocate(*args, _real=real, **kwargs):
            t = _real(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        monkeypatch.setattr(torch, name, allocate)


def randn(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype).to(KERNEL_DEVICE)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = x.double().cpu(), cos.double().cpu()[:, None], sin.double().cpu()[:, None]
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def angles(tokens: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    theta = torch.rand(tokens, head_dim // 2, dtype=torch.float64) * 6.3
    theta = torch.cat([theta, theta], dim=-1)
    return theta.cos().to(dtype).to(KERNEL_DEVICE), theta.sin().to(dtype).to(KERNEL_DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "with_residual", [pytest.param(True, id="add"), pytest.param(False, id="first-layer")]
)
@pytest.mark.parametrize("tokens, hidden", [(5, 200), (1, 576), (3, 64)])
def test_add_rms_norm(fused, monkeypatch, dtype, with_residual, tokens, hidden):
    torch.manual_seed(tokens * hidden)
    x, weight = randn(tokens, hidden, dtype=dtype, scale=3.0), randn(hidden, dtype=dtype)
    residual = randn(tokens, hidden, dtype=dtype, scale=3.0) if with_residual else None
    plain_normed, plain_stream = add_rms_norm(x, residual, weight, 1e-5)
    poison_allocations(monkeypatch)
    normed, stream = fused.add_rms_norm(x, residual, weight, 1e-5)
    assert normed.shape == x.shape and normed.dtype == dtype and stream.dtype == dtype
    stream64 = x.double() + (residual.double() if with_residual else 0)
    ref = stream64 * torch.rsqrt(stream64.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    expect_close(normed, ref, TOLERANCE[dtype], f"add_rms_norm {dtype} [{tokens}, {hidden}]")
    assert torch.equal(stream, plain_stream), (
        "the new residual must be x + residual rounded to x's dtype, as in torch"
    )
    if not with_residual:
        assert stream is x, "with no residual the stream is x itself (no copy)"
    expect_like_plain(normed, plain_normed, "round the norm to x's dtype before the weight multiplies it")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("q_heads, kv_heads, head_dim", [(9, 3, 64), (4, 4, 32), (3, 1, 128)])
def test_rope_rotates_a_strided_view_in_place(fused, dtype, q_heads, kv_heads, head_dim):
    torch.manual_seed(head_dim + q_heads)
    tokens = 7
    qkv = randn(tokens, q_heads + 2 * kv_heads, head_dim, dtype=dtype)
    cos, sin = angles(tokens, head_dim, dtype)
    before = qkv.clone()
    rotated_heads = q_heads + kv_heads
    plain = apply_rope(qkv[:, :rotated_heads], cos, sin)
    out = fused.rope(qkv[:, :rotated_heads], cos, sin)
    assert out.data_ptr() == qkv.data_ptr(), "rope rotates its input view in place and returns it"
    expect_close(
        qkv[:, :rotated_heads], rope_reference(before[:, :rotated_heads], cos, sin), TOLERANCE[dtype], "rope"
    )
    assert torch.equal(qkv[:, rotated_heads:], before[:, rotated_heads:]), "rope wrote into the value heads"
    expect_like_plain(out, plain, "round each product and the sum to the dtype, as torch's chain does")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, inter", [(5, 300), (2, 1100)])
def test_silu_mul(fused, monkeypatch, dtype, tokens, inter):
    torch.manual_seed(inter)
    gate_up = randn(tokens, 2 * inter, dtype=dtype, scale=4.0)
    plain = PLAIN_OPS.silu_mul(gate_up)
    poison_allocations(monkeypatch)
    out = fused.silu_mul(gate_up)
    assert out.shape == (tokens, inter) and out.dtype == dtype
    gate, up = gate_up.double().chunk(2, dim=-1)
    expect_close(
        out, torch.nn.functional.silu(gate) * up, TOLERANCE[dtype], f"silu_mul {dtype} [{tokens}, {inter}]"
    )
    expect_like_plain(out, plain, "round silu(gate) to the dtype before the product, as F.silu does")


@pytest.mark.parametrize(
    "dtype, cache_dtype, block_size",
    [
        pytest.param(torch.float32, torch.float32, 16, id="float32"),
        pytest.param(torch.bfloat16, torch.bfloat16, 16, id="bfloat16"),
        pytest.param(torch.bfloat16, torch.float32, 32, id="bfloat16-into-float32-cache"),
    ],
)
def test_rope_store_kv(fused, dtype, cache_dtype, block_size):
    torch.manual_seed(block_size)
    tokens, q_heads, kv_heads, head_dim, num_blocks = 9, 9, 3, 64, 4
    qkv = randn(tokens, q_heads + 2 * kv_heads, head_dim, dtype=dtype)
    cos, sin = angles(tokens, head_dim, dtype)
    k_cache, v_cache = (
        torch.full(
            (num_blocks, block_size, kv_heads, head_dim),
            float("nan"),
            dtype=cache_dtype,
            device=KERNEL_DEVICE,
        )
        for _ in range(2)
    )
    slots = torch.randperm(num_blocks * block_size)[:tokens]
    slots[[1, 6]] = -1  # padding tokens: no cache row
    before = qkv.clone()
    q = fused.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slots.to(KERNEL_DEVICE))
    assert q.shape == (tokens, q_heads, head_dim) and q.data_ptr() == qkv.data_ptr(), "q is a view of qkv"
    expect_close(q, rope_reference(before[:, :q_heads], cos, sin), TOLERANCE[dtype], "rotated queries")
    assert torch.equal(qkv[:, q_heads:], before[:, q_heads:]), (
        "the key and value heads of qkv must stay unchanged"
    )
    keys = apply_rope(before[:, q_heads : q_heads + kv_heads], cos, sin)
    kept = slots >= 0
    kept_here = kept.to(KERNEL_DEVICE)
    flat_k, flat_v = (c.view(-1, kv_heads, head_dim).cpu() for c in (k_cache, v_cache))
    written = torch.isfinite(flat_k).flatten(1).all(-1)
    assert written.sum() == kept.sum() and written[slots[kept]].all(), (
        "K rows written must be exactly the slots >= 0"
    )
    expect_close(
        flat_k[slots[kept]],
        rope_reference(before[kept_here, q_heads : q_heads + kv_heads], cos[kept_here], sin[kept_here]),
        TOLERANCE[dtype],
        "stored keys",
    )
    expect_like_plain(flat_k[slots[kept]], keys[kept_here].to(cache_dtype), "keys rotated as rope")
    v_rows = before[kept_here, q_heads + kv_heads :].to(cache_dtype).cpu()
    assert torch.equal(flat_v[slots[kept]], v_rows), (
        "values are stored as they are, cast to the cache's dtype"
    )
    assert torch.isfinite(flat_v).flatten(1).all(-1).sum() == kept.sum(), (
        "V rows written must be exactly the slots"
    )


def ones(*shape: int) -> torch.Tensor:
    return torch.ones(shape)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda f: f.add_rms_norm(ones(2, 8), ones(3, 8), ones(8), 1e-5), "residual must match"),
        (lambda f: f.add_rms_norm(ones(2, 8), None, ones(7), 1e-5), r"weight must be a contiguous \[8\]"),
        (lambda f: f.rope(ones(2, 3, 6), ones(2, 5), ones(2, 5)), r"cos and sin must be \[T, D\]"),
        (lambda f: f.rope(ones(2, 3, 5), ones(2, 5), ones(2, 5)), "even head dim"),
        (lambda f: f.rope(ones(2, 3, 8)[..., ::2], ones(2, 4), ones(2, 4)), "stride 1"),
        (lambda f: f.silu_mul(ones(2, 7)), "side by side"),
        (lambda f: f.rope_store_kv(ones(2, 5, 8), ones(2, 8), ones(2, 8), *ones(2, 3, 16, 3, 8), ones(2)),
         "query heads plus"),
        (lambda f: f.rope_store_kv(ones(2, 7, 8), ones(2, 8), ones(2, 8), *ones(2, 3, 16, 2, 8), ones(2)),
         "int32/int64"),
    ],
    ids=["residual-shape", "weight-shape", "angles-shape", "odd-head-dim", "strided-last-dim", "odd-width",
         "heads-mismatch", "float-slots"],
)  # fmt: skip
def test_clear_errors(fused, call, match):
    with pytest.raises(ValueError, match=match):
        call(fused)


def test_select_layer_ops(monkeypatch):
    """The Triton set on CUDA (choosing it touches no GPU), PLAIN_OPS on CPU and wherever FASTMODE_FUSED=0."""
    monkeypatch.delenv("FASTMODE_FUSED", raising=False)
    assert select_layer_ops("cpu") is PLAIN_OPS
    triton_ops = select_layer_ops(torch.device("cuda"))
    assert triton_ops.name == "triton" and triton_ops.rope_store_kv is not None
    monkeypatch.setenv("FASTMODE_FUSED", "0")
    assert select_layer_ops("cuda") is PLAIN_OPS
    monkeypatch.setenv("FASTMODE_FUSED", "yes")
    with pytest.raises(ValueError, match="FASTMODE_FUSED must be 0 or 1"):
        select_layer_ops("cuda")
    monkeypatch.delenv("FASTMODE_FUSED")
    labs_ops, labs_llama = (importlib.import_module(f"labs.model.{m}") for m in ("layer_ops", "llama"))
    assert labs_ops.select_layer_ops("cuda") is labs_llama.PLAIN_OPS, (
        "labs/ must run the learner's own chains"
    )


TINY = ModelConfig(
    vocab_size=97, hidden_size=192, intermediate_size=200, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=32, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=128, tie_word_embeddings=True,
)  # fmt: skip


def tiny_llama(dtype: torch.dtype) -> LlamaModel:
    """``TINY`` with random weights (GQA ratio 3)."""
    return random_llama(TINY, dtype, KERNEL_DEVICE)


def greedy_run(
    model: LlamaModel, ops, prompt: list[int], new_tokens: int
) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill ``prompt``, then decode greedily through the paged Triton kernels, each decode step padded with
    one row as a CUDA graph bucket pads (no slot, no context). Returns the tokens and each step's logits."""
    from solutions.cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache

    model.use_ops(ops)
    dev, i32 = KERNEL_DEVICE, torch.int32
    config, block_size = model.config, 16
    cache = PagedKVCache(
        config.num_layers, 6, block_size, config.num_kv_heads, config.head_dim, model.rope_cos.dtype, dev
    )
    blocks = torch.tensor([4, 1, 5, 2], dtype=i32)  # shuffled, block 0 is the null block
    tokens, logits = list(prompt), []
    with torch.inference_mode():
        for step in range(new_tokens):
            start = 0 if step == 0 else len(tokens) - 1
            positions = torch.arange(start, len(tokens))
            slots = blocks[positions // block_size].long() * block_size + positions % block_size
            q_len, rows = len(positions), 1 if step == 0 else 2
            meta = AttentionMetadata(
                slot_mapping=torch.cat([slots, torch.full((rows - 1,), -1)]).to(dev),
                block_table=torch.stack([blocks, torch.zeros(4, dtype=i32)])[:rows].to(dev),
                query_start_loc=torch.tensor([0, q_len, q_len + 1][: rows + 1], dtype=i32, device=dev),
                seq_lens=torch.tensor([len(tokens), 0][:rows], dtype=i32, device=dev),
                max_query_len=q_len,
                max_seq_len=len(tokens),
            )
            ids = torch.tensor(tokens[start:] + [0] * (rows - 1), device=dev)
            hidden = model(ids, torch.cat([positions, torch.zeros(rows - 1, dtype=torch.long)]).to(dev),
                           PagedAttention(cache, meta, backend="triton"))  # fmt: skip
            step_logits = model.logits(hidden[q_len - 1 : q_len])
            logits.append(step_logits.cpu())
            tokens.append(int(step_logits.argmax()))
    return tokens[len(prompt) :], logits


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["float32", "bfloat16"]
)
def test_tiny_llama_fused_ops_match_plain(dtype, tol):
    """The whole model with the Triton set (RoPE fused with the KV store) against PLAIN_OPS, both over the
    paged Triton attention: the same logits within ``tol`` (relative), and in float32 the same greedy
    tokens."""
    counted = []
    ops = triton_layer_ops()
    counting = dataclasses.replace(ops, rope_store_kv=lambda *a: counted.append(1) or ops.rope_store_kv(*a))
    model = tiny_llama(dtype)
    prompt = [5, 17, 3, 88, 41, 9, 60, 2, 33, 71, 12]
    plain_tokens, plain_logits = greedy_run(model, PLAIN_OPS, prompt, 4)
    fused_tokens, fused_logits = greedy_run(model, counting, prompt, 4)
    assert len(counted) == 4 * TINY.num_layers, "each layer of each step must store through rope_store_kv"
    for step, (ours, theirs) in enumerate(zip(fused_logits, plain_logits)):
        expect_close(ours, theirs, tol, f"{dtype} logits at step {step}, fused vs plain ops")
    if dtype == torch.float32:
        assert fused_tokens == plain_tokens, (
            f"greedy tokens differ: fused {fused_tokens}, plain {plain_tokens}"
        )


def test_bench_kernels_smoke(capsys):
    """``bench kernels --smoke`` runs the GPU benchmark's code on tiny shapes (interpreter on a CPU)."""
    from solutions.cli.bench import kernels

    assert kernels.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "rope_store_kv" in out and "layer us" in out, "the op table and the layer table must both print"


def test_dispatched_ops_lists_what_computes_and_leaves_out_views():
    """Notebook 00 counts the plain chains' operators with it: a view (the split of SiLU-mul's input) is not
    a kernel; a Triton kernel is not an aten operator."""
    from solutions.bench.kernels import dispatched_ops

    gate_up = torch.randn(1, 8)
    assert dispatched_ops(lambda: PLAIN_OPS.silu_mul(gate_up)) == ["silu", "mul"]
    x, residual, weight = torch.randn(3, 1, 8, dtype=torch.bfloat16)
    norm = dispatched_ops(lambda: PLAIN_OPS.add_rms_norm(x, residual, weight[0], 1e-5))
    assert norm[0] == "add" and "rsqrt" in norm and norm.count("_to_copy") == 2, norm
