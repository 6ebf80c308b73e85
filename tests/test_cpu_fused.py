"""The fused CPU layer ops (``model/cpu_layer_ops.py`` over ``kernels/cpu_aot.py``): each chain against a
float64 reference and against ``PLAIN_OPS``, in float32 and bfloat16, at sizes no library was compiled for;
inputs a library was not built for falling back to the plain chain; a tiny random Llama decoding the same
greedy tokens with them; and the choice: compiled where it measures faster, plain without a C++ compiler.

The first run on a machine compiles six small libraries (minutes); later runs load them in milliseconds.
"""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_models import random_llama

from solutions.kernels import cpu_aot
from solutions.kernels.cpu_linear import REGIMES
from solutions.model import cpu_layer_ops
from solutions.model.config import ModelConfig
from solutions.model.llama import PLAIN_OPS, LlamaModel

DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.bfloat16, id="bfloat16")]
# Relative error to the float64 reference: the fused chain may be at most this much worse than the plain one.
SLACK = {torch.float32: 1e-6, torch.bfloat16: 1e-3}


@pytest.fixture(scope="module", params=DTYPES)
def fused(request):
    """The fused chains of one dtype (skipped where no library can be built: no C++ compiler)."""
    dtype = request.param
    runners = compiled_or_skip(dtype)
    return dtype, {name: cpu_layer_ops.FUSED[name](run, dtype) for name, run in runners.items()}


def compiled_or_skip(dtype: torch.dtype) -> dict:
    """``compiled_chains(dtype)``; where none could be built, skip, giving the builder's reason (its log)."""
    said: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = said.append
    logging.getLogger("fastmode").addHandler(handler)
    try:
        runners = cpu_layer_ops.compiled_chains(dtype)
    finally:
        logging.getLogger("fastmode").removeHandler(handler)
    if not runners:
        why = "; ".join(record.getMessage() for record in said) or "a build failed earlier in this process"
        pytest.skip(f"AOTInductor cannot build libraries here: {why}")
    return runners


def reference(name: str, args: tuple) -> list[torch.Tensor]:
    """The chain in float64, written out from its definition (not through the function under test)."""
    if name == "add_rms_norm":
        x, residual, weight, eps = args
        stream = x.double() + residual.double()
        normed = stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
        return [normed, stream]
    if name == "rope":
        qk, cos, sin = (t.double() for t in args)
        half = qk.shape[-1] // 2
        a, b = qk[..., :half], qk[..., half:]
        c, s = cos[:, None, :half], sin[:, None, :half]
        return [torch.cat([a * c - b * s, b * c + a * s], dim=-1)]
    gate, up = args[0].double().chunk(2, dim=-1)
    return [gate * torch.sigmoid(gate) * up]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


def outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, tuple) else [result]


# Sizes no library was compiled for (the examples are 40 / 5+2 heads of 8 / 7): odd widths, a GQA ratio of 3.
SIZES = [
    pytest.param(dict(hidden=576, heads=12, kv_heads=3, head_dim=64, intermediate=1536), id="smollm2"),
    pytest.param({"hidden": 33, "heads": 4, "kv_heads": 1, "head_dim": 6, "intermediate": 13}, id="odd"),
]


@pytest.mark.parametrize("rows", [1, 5, 130])
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("name", list(cpu_layer_ops.CHAINS))
def test_fused_chain_matches_float64_and_plain(fused, name, sizes, rows):
    dtype, chains = fused
    args = cpu_layer_ops.CHAINS[name].inputs(rows, sizes, dtype, torch.Generator().manual_seed(rows))
    if name == "add_rms_norm":
        args = (*args[:3], 1e-5)  # the model passes eps as a float
    with torch.inference_mode():
        got, plain = outputs(chains[name](*args)), outputs(cpu_layer_ops.CHAINS[name].plain(*args))
    for i, (g, p, want) in enumerate(zip(got, plain, reference(name, args), strict=True)):
        what = f"{name} output {i} ({dtype}, {rows} rows, {sizes})"
        assert g.dtype == p.dtype == dtype and g.shape == p.shape, f"{what}: {g.dtype} {tuple(g.shape)}"
        fused_err, plain_err = rel_err(g, want), rel_err(p, want)
        assert fused_err <= plain_err + SLACK[dtype], (
            f"{what}: relative error {fused_err:.2e}, the plain chain's {plain_err:.2e}"
        )
        if dtype == torch.float32 and name == "rope":  # two products and a sum per element, as eager
            same = torch.equal(g, p)
            assert same, f"rope ({rows} rows, {sizes}): float32 result differs from the plain chain's"


def test_inputs_a_library_was_not_built_for_run_the_plain_chain(fused):
    """Another dtype, a missing residual (the first layer), a strided input, a tensor needing gradients: the
    plain function's result, not a wrong read of memory."""
    dtype, chains = fused
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    x, weight = torch.randn(4, 24).to(dtype), torch.ones(24, dtype=dtype)
    cases = [
        ("add_rms_norm", (x.to(other), x.to(other), weight.to(other), 1e-5)),
        ("add_rms_norm", (x, None, weight, 1e-5)),
        ("add_rms_norm", (torch.randn(24, 4).to(dtype).t(), x, weight, 1e-5)),
        ("silu_mul", (torch.randn(8, 4).to(dtype).t(),)),
        ("silu_mul", (torch.randn(4, 8, dtype=dtype, requires_grad=True),)),
        ("rope", (torch.randn(2, 3, 8).to(other), torch.randn(2, 8).to(other), torch.randn(2, 8).to(other))),
    ]
    for i, (name, args) in enumerate(cases):
        got, want = outputs(chains[name](*args)), outputs(cpu_layer_ops.CHAINS[name].plain(*args))
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), f"case {i}: {name} differs"


TINY = ModelConfig(
    vocab_size=97, hidden_size=48, intermediate_size=40, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=128, tie_word_embeddings=True,
)  # fmt: skip


def tiny_llama(dtype: torch.dtype) -> LlamaModel:
    """``TINY`` with random weights (GQA ratio 3)."""
    return random_llama(TINY, dtype, "cpu")


def greedy_decode(model: LlamaModel, ops, prompt: list[int], new_tokens: int):
    """Prefill, then one-token decode steps through the engine's paged CPU attention: the new tokens, and
    each step's logits."""
    from solutions.cache.paged_kv_cache import AttentionMetadata, PagedAttention, PagedKVCache

    model.use_ops(ops)
    cache = PagedKVCache(TINY.num_layers, 8, 16, TINY.num_kv_heads, TINY.head_dim, torch.float32, "cpu")
    blocks = torch.tensor([5, 2, 6], dtype=torch.int32)  # out of order, as a used engine hands them out
    tokens, logits = list(prompt), []
    with torch.inference_mode():
        for step in range(new_tokens):
            start = 0 if step == 0 else len(tokens) - 1
            positions = torch.arange(start, len(tokens))
            meta = AttentionMetadata(
                slot_mapping=blocks[positions // 16].long() * 16 + positions % 16,
                block_table=blocks[None],
                query_start_loc=torch.tensor([0, len(positions)], dtype=torch.int32),
                seq_lens=torch.tensor([len(tokens)], dtype=torch.int32),
                max_query_len=len(positions),
                max_seq_len=len(tokens),
            )
            hidden = model(torch.tensor(tokens[start:]), positions, PagedAttention(cache, meta, "torch"))
            logits.append(model.logits(hidden[-1:])[0])
            tokens.append(int(logits[-1].argmax()))
    return tokens[len(prompt) :], torch.stack(logits)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_llama_decodes_the_same_with_fused_ops(dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path))  # the decisions: measured afresh
    model = tiny_llama(dtype)
    ops = cpu_layer_ops.cpu_layer_ops(model)
    if ops is PLAIN_OPS:
        pytest.skip("no fused chain measured faster or could be built here")
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19, 71]
    plain_tokens, plain_logits = greedy_decode(model, PLAIN_OPS, prompt, 12)
    fused_tokens, fused_logits = greedy_decode(model, ops, prompt, 12)
    assert fused_tokens == plain_tokens, f"{dtype}: greedy tokens differ with {ops.name} ops"
    error = float((fused_logits - plain_logits).norm() / plain_logits.norm())
    bound = 1e-5 if dtype == torch.float32 else 2e-2
    assert error < bound, f"{dtype}: logits differ by {error:.1e} (relative)"


@pytest.mark.parametrize("missing", ["compiler", "build"])
def test_without_a_compiler_the_plain_ops_with_one_log_line(missing, tmp_path, monkeypatch, caplog):
    """No C++ compiler on PATH, or a build that fails: PLAIN_OPS, one warning, no exception, no second try."""
    monkeypatch.setenv("FASTMODE_KERNEL_CACHE", str(tmp_path / "kernels"))  # nothing compiled there yet
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path / "cache"))
    if missing == "compiler":
        monkeypatch.setattr(cpu_aot.shutil, "which", lambda name: None)  # as on a machine without g++
    else:

        def failing_build(*args):
            raise OSError("g++: exit status 1")

        monkeypatch.setattr(cpu_aot, "_compile", failing_build)
    with caplog.at_level(logging.INFO, logger="fastmode"):
        assert cpu_layer_ops.cpu_layer_ops(tiny_llama(torch.float32)) is PLAIN_OPS
        assert cpu_layer_ops.cpu_layer_ops(tiny_llama(torch.float32)) is PLAIN_OPS
    lines = [r.getMessage() for r in caplog.records if "fused CPU ops" in r.getMessage()]
    why = "no C++ compiler" if missing == "compiler" else "g++: exit status 1"
    assert len(lines) == (1 if missing == "compiler" else 2), f"expected one line saying why, got {lines}"
    assert why in lines[-1] and "plain ops" in lines[-1], lines[-1]


def test_the_choice_follows_the_measurement_per_regime(tmp_path, monkeypatch):
    """A chain measured slower than plain is not chosen; one faster at one row only runs at one row."""
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path))
    compiled_or_skip(torch.float32)
    plain_wins = {r: {"path": "plain", "us": {"plain": 1.0, "compiled": 2.0}} for r in REGIMES}
    monkeypatch.setattr(cpu_layer_ops, "measure_chain", lambda *args: plain_wins)
    model = tiny_llama(torch.float32)
    assert cpu_layer_ops.cpu_layer_ops(model, use_cache=False) is PLAIN_OPS
    decode_only = {**plain_wins, "decode": {"path": "compiled", "us": {"plain": 2.0, "compiled": 1.0}}}
    monkeypatch.setattr(cpu_layer_ops, "measure_chain", lambda *args: decode_only)
    rows_seen = []
    fused_silu = cpu_layer_ops.FUSED["silu_mul"]

    def spying_silu(run, dtype):
        fused = fused_silu(run, dtype)
        return lambda gate_up: rows_seen.append(gate_up.shape[0]) or fused(gate_up)

    monkeypatch.setitem(cpu_layer_ops.FUSED, "silu_mul", spying_silu)
    ops = cpu_layer_ops.cpu_layer_ops(model, use_cache=False)
    assert ops.name == "cpu-fused"
    for rows in (1, 4, 100):
        gate_up = torch.randn(rows, 80)
        # Within float32 rounding, not bitwise: the compiled SiLU's exp differs from eager's by an ulp or so
        # at widths that are no multiple of the vector; which path ran is what rows_seen checks.
        torch.testing.assert_close(ops.silu_mul(gate_up), PLAIN_OPS.silu_mul(gate_up), msg=f"{rows} rows")
    assert rows_seen == [1], f"the compiled chain ran at {rows_seen} rows; it won only at one row (decode)"


def test_select_layer_ops_on_a_cpu(tmp_path, monkeypatch):
    """Given the model, a CPU gets the measured set; without it, or with FASTMODE_FUSED=0, PLAIN_OPS and no
    compiling at all."""
    from solutions.model.layer_ops import select_layer_ops

    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path))
    model = tiny_llama(torch.float32)
    measured = cpu_layer_ops.cpu_layer_ops(model)
    monkeypatch.delenv("FASTMODE_FUSED", raising=False)
    assert select_layer_ops("cpu", model).name == measured.name
    assert select_layer_ops("cpu") is PLAIN_OPS

    def no_compiling(dtype):
        raise AssertionError("FASTMODE_FUSED=0 must not compile or measure anything")

    monkeypatch.setattr(cpu_layer_ops, "compiled_chains", no_compiling)
    monkeypatch.setenv("FASTMODE_FUSED", "0")
    assert select_layer_ops(torch.device("cpu"), model) is PLAIN_OPS


def test_the_labs_package_runs_the_learners_functions(monkeypatch):
    """Under labs/ the chains are a learner's functions: graded as written, never compiled."""
    import importlib

    labs_ops = importlib.import_module("labs.model.cpu_layer_ops")
    labs_llama = importlib.import_module("labs.model.llama")

    def no_compiling(dtype):
        raise AssertionError("labs/ must not compile the learner's functions")

    monkeypatch.setattr(labs_ops, "compiled_chains", no_compiling)
    assert labs_ops.cpu_layer_ops(tiny_llama(torch.float32)) is labs_llama.PLAIN_OPS
