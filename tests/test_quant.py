"""Lesson 6: INT4 packing, round-to-nearest, the W4A16 kernels, AWQ's scale search, the quantized engine."""

from __future__ import annotations

import copy
import io
import math
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
from kernel_device import KERNEL_DEVICE

ROOT = Path(__file__).resolve().parent.parent
EVAL_TEXT = ROOT / "data" / "text" / "kjv_luke_1-12.txt"


def _dequantize_reference(q, scales, zeros, group_size):
    """Float64 ``(q - zero) * scale``, group by group, for the kernels to be graded against."""
    expand = lambda t: t.double().repeat_interleave(group_size, dim=1)
    return (q.double() - expand(zeros)) * expand(scales)


# ---------------------------------------------------------------- packing (Lab 6)


@pytest.mark.lab6
@pytest.mark.parametrize("shape", [(8,), (3, 16), (2, 5, 64), (7, 576)], ids=lambda s: "x".join(map(str, s)))
def test_pack_unpack_round_trip(load, shape):
    pack = load("quant.pack")
    values = torch.randint(0, 16, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    packed = pack.pack_int4(values)
    want = (*shape[:-1], shape[-1] // 8)
    assert packed.dtype == torch.int32, f"pack_int4 returned {packed.dtype}: the words must be int32"
    assert packed.shape == want, (
        f"pack_int4 gave shape {tuple(packed.shape)}, expected {want}: 8 values per word"
    )
    unpacked = pack.unpack_int4(packed)
    assert unpacked.dtype == torch.uint8, f"unpack_int4 returned {unpacked.dtype}, expected uint8"
    wrong = int((unpacked != values).sum())
    assert wrong == 0, f"unpack_int4(pack_int4(v)) differs from v in {wrong} of {values.numel()} values"


@pytest.mark.lab6
def test_pack_layout_is_element_k_at_bit_4k(load):
    pack = load("quant.pack")
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7, 15], dtype=torch.uint8)
    word = sum(int(v) << (4 * i) for i, v in enumerate(values.tolist()))
    expected = word - (1 << 32)  # element 7 is 15, so the word's sign bit is set
    got = pack.pack_int4(values).tolist()
    assert got == [expected], (
        f"pack_int4({values.tolist()}) = {got}, expected [{expected}] (0x{word:08X}): element k belongs at "
        f"bits 4k..4k+3, so element 0 is the lowest hex digit; yours reads 0x{got[0] & 0xFFFFFFFF:08X}"
    )
    back = pack.unpack_int4(torch.tensor([expected], dtype=torch.int32)).tolist()
    assert back == values.tolist(), (
        f"unpack_int4 of 0x{word:08X} gave {back}: field i is (word >> 4 * i) & 0xF; "
        "a negative word shifts its sign bit in, which the mask must drop"
    )


@pytest.mark.lab6
def test_pack_layout_keeps_neighbours_in_one_word(load):
    """Eight values make one word, so a test of eight values cannot tell word k // 8 from a stride: here each
    row holds 24 values, three words. The INT4 kernels read element k from word k // 8, field k % 8; a packing
    that strides (element k to word k % (K / 8)) round-trips through its own unpack and still feeds the
    kernels scrambled weights."""
    pack = load("quant.pack")
    values = torch.arange(48, dtype=torch.uint8).reshape(2, 24) % 16
    words = [
        [sum(int(values[r, 8 * j + i]) << (4 * i) for i in range(8)) for j in range(3)] for r in range(2)
    ]
    expected = [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words]
    got = pack.pack_int4(values).tolist()
    strided = [
        [sum(int(values[r, 3 * i + j]) << (4 * i) for i in range(8)) for j in range(3)] for r in range(2)
    ]
    if [[w & 0xFFFFFFFF for w in row] for row in got] == strided:
        raise AssertionError(
            "pack_int4 strides: element k went to word k % (K // 8) at field k // (K // 8). Element k "
            "belongs in word k // 8 at bits 4 * (k % 8): reshape the last dimension to [K // 8, 8], "
            "not [8, K // 8], and unpack the same way (the round trip hides this, the INT4 kernels do not)"
        )
    assert got == expected, (
        f"pack_int4 of a [2, 24] row gave words {[[hex(w & 0xFFFFFFFF) for w in row] for row in got]}, "
        f"expected {[[hex(w) for w in row] for row in words]}: element k in word k // 8 at bits 4 * (k % 8)"
    )
    back = pack.unpack_int4(torch.tensor(expected, dtype=torch.int32))
    assert back.tolist() == values.tolist(), (
        "unpack_int4 of correctly packed words gave other values: field i of word j is element 8 * j + i"
    )


def test_pack_rejects_bad_input(load):
    pack = load("quant.pack")
    with pytest.raises(ValueError, match="multiple of 8"):
        pack.pack_int4(torch.zeros(2, 12, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack.pack_int4(torch.full((8,), 16))
    with pytest.raises(ValueError, match="int32"):
        pack.unpack_int4(torch.zeros(2, dtype=torch.int64))


# ---------------------------------------------------------------- round-to-nearest


@pytest.mark.parametrize("w_bit", [3, 4])
def test_rtn_error_is_at_most_half_a_step(load, w_bit):
    rtn = load("quant.rtn")
    weight = torch.randn(40, 192, generator=torch.Generator().manual_seed(1))
    g = rtn.quantize(weight, w_bit, 64)
    assert int(g.q.max()) <= 2**w_bit - 1
    step = g.scales.repeat_interleave(64, dim=1)
    assert ((g.dequantize() - weight).abs() <= step / 2 + 1e-6).all()


def test_rtn_rejects_bad_arguments(load):
    rtn = load("quant.rtn")
    with pytest.raises(ValueError, match="w_bit"):
        rtn.quantize(torch.randn(4, 64), 5, 64)
    with pytest.raises(ValueError, match=r"does not divide the 576 input features.*4.5 x 128"):
        rtn.quantize(torch.randn(4, 576), 4, 128)
    with pytest.raises(ValueError, match="multiple of 8"):
        rtn.quantize(torch.randn(4, 60), 4, 12)


# ---------------------------------------------------------------- the W4A16 kernels and the packed module

# Kernel tests run on KERNEL_DEVICE: compiled on a GPU, through the Triton interpreter on a CPU.
# Max error relative to the largest output, against float64 x @ dequantized W^T. float32: the codes are
# read exactly, scales and sums round in float32. bfloat16: the output (and, on tensor cores, each
# dequantized weight) rounds to bfloat16.
W4A16_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _w4a16_case(load, m, n, k, group_size, dtype, seed):
    """Random codes, scales and zeros as ``quant.rtn`` makes them, packed; x; the float64 product."""
    rtn, pack = load("quant.rtn"), load("quant.pack")
    gen = torch.Generator().manual_seed(seed)
    g = rtn.quantize(torch.randn(n, k, generator=gen), 4, group_size)
    x = torch.randn(m, k, generator=gen).to(dtype)
    scales = g.scales.half()
    expected = x.double() @ _dequantize_reference(g.q, scales, g.zeros, group_size).T
    operands = [t.to(KERNEL_DEVICE) for t in (x, pack.pack_int4(g.q), scales, g.zeros)]
    return operands, expected


@pytest.mark.parametrize("split_k", [None, 3], ids=["tuned", "split3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(
    "m, n, k, group_size",
    [(1, 37, 96, 32), (1, 70, 200, 40), (3, 70, 200, 40), (4, 64, 384, 128), (16, 130, 256, 64),
     (100, 37, 320, 64)],
)  # fmt: skip
def test_w4a16_kernel_matches_dequantize_then_matmul(load, m, n, k, group_size, dtype, split_k):
    """GEMV (1 row), the skinny GEMM (2-16 rows) and the prefill GEMM; odd N, K off the 128-wide tile, groups
    of 32-128 and a non-power-of-two 40; split-K with splits that get no K tile (K = 96 is one tile)."""
    kernel = load("kernels.awq_gemm")
    (x, qweight, scales, zeros), expected = _w4a16_case(load, m, n, k, group_size, dtype, seed=m * 1000 + n)
    out = kernel.awq_gemm(x, qweight, scales, zeros, group_size, split_k=split_k)
    assert out.shape == (m, n) and out.dtype == dtype and out.device.type == KERNEL_DEVICE.type
    err = ((out.cpu().double() - expected).abs().max() / expected.abs().max()).item()
    case = f"{m}x{n}x{k} g{group_size} {dtype}, split {split_k}"
    assert err < W4A16_TOLERANCE[dtype], f"{case}: relative error {err:.2e} against float64"


def test_w4a16_autotune_candidates_cover_every_launch(load):
    """The candidates timed on CUDA, pruned per launch (checked here without a GPU): every row bucket keeps at
    least one, the GEMV (one row) only GEMV tiles, rows beyond 16 no split, and a split keeps 2 K tiles."""
    kernel = load("kernels.awq_gemm")
    shapes = [(6144, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (49152, 2048), (37, 96)]  # 1.7B-shape
    for float32 in (False, True):
        for m_bucket in (1, 2, 4, 8, 16, 32, 64, 1024):
            configs = (kernel._gemv_autotuned if m_bucket == 1 else kernel._gemm_autotuned).configs
            for n, k in shapes:
                kept = kernel._worth_timing(configs, m_bucket, n, k, 132, float32)
                assert kept, f"no candidate for {m_bucket} rows, {n} x {k}, float32={float32}"
                for c in kept:
                    block_m, split = c.kwargs.get("BLOCK_M"), c.kwargs["SPLIT_K"]
                    assert (block_m is None) == (m_bucket == 1), f"{c} for {m_bucket} rows"
                    k_tiles = -(-k // kernel.BLOCK_K)
                    assert split == 1 or (m_bucket <= 16 and k_tiles >= 2 * split), f"{c} at K={k}"


@pytest.mark.interpreter  # on a GPU the compiled kernels run this path for real
def test_w4a16_autotuned_path_runs_under_a_cpu_timer(load, monkeypatch):
    """The CUDA launch path (candidates pruned per launch, the post-hook that adds a split's partial sums
    inside each timed call, the chosen split read back for the real call) driven through the interpreter,
    with small candidates and a timer that prefers the last one, the largest split: what only a GPU runs."""
    import itertools

    import triton

    kernel = load("kernels.awq_gemm")
    countdown = itertools.count(1000, -1)

    def timer(kernel_call, quantiles):
        kernel_call()
        return [next(countdown)] * len(quantiles)

    def tuned(jitted, configs, key):
        pruning = {"early_config_prune": kernel._prune}
        hook = kernel._sum_splits_when_timed
        return triton.autotune(configs, key, prune_configs_by=pruning, post_hook=hook, do_bench=timer)(jitted)

    gemv = [triton.Config({"BLOCK_N": 32, "SPLIT_K": s, "STAGES": 1}) for s in (1, 2, 4)]
    skinny = [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT_K": s, "GROUP_SIZE_M": 1, "SWAP_AB": True})
              for s in (1, 2, 4)]  # fmt: skip
    prefill = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "SPLIT_K": 1, "GROUP_SIZE_M": 2, "SWAP_AB": 0})]
    gemv_tuned = tuned(kernel._w4a16_gemv_kernel, gemv, ["N", "K", "GROUP"])
    gemm_tuned = tuned(kernel._w4a16_gemm_kernel, skinny + prefill, ["M_BUCKET", "N", "K", "GROUP"])
    monkeypatch.setattr(kernel, "autotunes_on", lambda device: True)
    monkeypatch.setattr(kernel, "_sm_count", lambda device_index: 4)
    monkeypatch.setattr(kernel, "_gemv_autotuned", gemv_tuned)
    monkeypatch.setattr(kernel, "_gemm_autotuned", gemm_tuned)
    kernel._max_split.cache_clear()
    try:
        for m, split in ((1, 4), (4, 4), (40, 1)):  # 2 column tiles x 8 K tiles on 4 SMs: splits up to 4
            (x, qweight, scales, zeros), expected = _w4a16_case(load, m, 64, 1024, 64, torch.float32, seed=m)
            out = kernel.awq_gemm(x, qweight, scales, zeros, 64)
            chosen = (gemv_tuned if m == 1 else gemm_tuned).best_config.kwargs["SPLIT_K"]
            assert chosen == split, f"{m} rows: the timer picks the last candidate (split {split}): {chosen}"
            err = ((out.double() - expected).abs().max() / expected.abs().max()).item()
            assert err < 1e-5, f"{m} rows, autotuned path, split {chosen}: relative error {err:.2e}"
    finally:
        kernel._max_split.cache_clear()


@pytest.mark.interpreter  # on a GPU the compiled kernels run this path for real
def test_w4a16_untimed_cuda_path_runs_each_launchs_first_candidate(load, monkeypatch):
    """FASTMODE_AUTOTUNE=0 and a chosen split on CUDA run the launch's first candidate untimed (a GEMV,
    skinny and prefill tile), driven here through the interpreter."""
    kernel = load("kernels.awq_gemm")
    monkeypatch.setattr(kernel, "autotunes_on", lambda device: True)
    monkeypatch.setattr(kernel, "_sm_count", lambda device_index: 4)
    for m, split_k, knob in ((1, None, "0"), (4, None, "0"), (40, None, "0"), (4, 3, "1")):
        monkeypatch.setenv("FASTMODE_AUTOTUNE", knob)
        (x, qweight, scales, zeros), expected = _w4a16_case(load, m, 64, 256, 64, torch.float32, seed=m)
        out = kernel.awq_gemm(x, qweight, scales, zeros, 64, split_k=split_k)
        err = ((out.double() - expected).abs().max() / expected.abs().max()).item()
        assert err < 1e-5, f"{m} rows, split {split_k}, FASTMODE_AUTOTUNE={knob}: relative error {err:.2e}"


def test_w4a16_refuses_to_autotune_while_a_cuda_graph_captures(load, monkeypatch):
    """A launch never timed, met during a capture, fails naming the warm-up to do, not inside the capture."""
    kernel = load("kernels.awq_gemm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="never autotuned.*once eagerly"):
        kernel._refuse_tuning_in_a_graph((True, 1, 72, 384, 128, torch.float32))


def test_w4a16_kernel_rejects_mismatched_operands(load):
    kernel = load("kernels.awq_gemm")
    qweight, scales, zeros = torch.zeros(8, 4, dtype=torch.int32), torch.ones(8, 1).half(), torch.zeros(8, 1)
    with pytest.raises(ValueError, match="features"):
        kernel.awq_gemm(torch.randn(2, 40), qweight, scales, zeros, 32)
    with pytest.raises(ValueError, match="does not divide|multiple of 8"):
        kernel.awq_gemm(torch.randn(2, 32), qweight, scales, zeros, 24)
    with pytest.raises(ValueError, match="split_k"):
        kernel.awq_gemm(torch.randn(2, 32), qweight, scales, zeros, 32, split_k=0)


def test_bench_int4_smoke_runs_every_product_and_states_the_goal(capsys):
    """``bench int4 --smoke``: a toy shape through whatever device is here; the figures mean nothing, the
    table, the kernel's error column and the goal lines must be there."""
    from solutions.cli.bench.int4 import main

    assert main(["--smoke", "--rows", "1", "4"]) == 0
    out = capsys.readouterr().out
    products = {"qkv", "o", "gate_up", "down", "lm_head"}
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in products]
    assert len(rows) == 10, f"expected 5 products x 2 row counts in:\n{out}"
    assert max(float(row[-1]) for row in rows) < 1e-2, f"the kernel's error column is too large:\n{out}"
    assert "goal: INT4 at one row" in out and "one decoder layer's products at 4 row(s)" in out, out


@pytest.mark.requires_cuda
@pytest.mark.parametrize("m", [1, 4, 40], ids=lambda m: f"{m}rows")
def test_w4a16_replays_in_a_cuda_graph_and_is_deterministic(load, m):
    """After one eager call (which autotunes), the product replays from a CUDA graph for new activations, with
    the same bits as an eager call: split-K partial sums are added in a fixed order, never by atomics."""
    kernel = load("kernels.awq_gemm")
    (x, qweight, scales, zeros), _ = _w4a16_case(load, m, 512, 2048, 64, torch.bfloat16, seed=m)
    product = lambda: kernel.awq_gemm(x, qweight, scales, zeros, 64)  # noqa: E731
    first = product()
    assert torch.equal(first, product()), "two eager calls on one input differ: a nondeterministic reduction"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = product()
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert torch.equal(captured, product()), "the replayed graph differs from an eager call on the same input"


@pytest.mark.requires_cuda
def test_quant_linear_cuda_runs_the_triton_kernels(load):
    linear = load("quant.linear")
    weight = torch.randn(192, 576, generator=torch.Generator().manual_seed(2)).cuda()
    module = linear.QuantLinear.from_float(weight, 4, 64)
    assert module.backend == "triton"
    w = module.dequantize().double()
    for rows in (1, 5, 40):
        x = torch.randn(rows, 576, device="cuda")
        expected = x.double() @ w.T
        for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
            y = module(x.to(dtype))
            err = ((y.double() - expected).abs().max() / expected.abs().max()).item()
            assert y.dtype == dtype and err < tol, f"{rows} rows, {dtype}: relative error {err:.2e}"


def test_quant_linear_cpu_kernel_and_rows(load):
    """torch's CPU int4 kernel computes x W^T for our codes,
    and ``rows`` reads its tiled layout back exactly."""
    linear = load("quant.linear")
    weight = torch.randn(192, 576, generator=torch.Generator().manual_seed(2))
    module = linear.QuantLinear.from_float(weight, 4, 64)
    assert module.backend == "cpu"
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(3))
    w = module.dequantize()
    expected = x.double() @ w.double().T
    assert (module(x).double() - expected).abs().max() / expected.abs().max() < 1e-2  # bfloat16 activations
    assert (w - weight).abs().max() < 0.5  # within a step of the float weight
    ids = torch.tensor([[5, 64], [191, 0]])
    assert torch.equal(module.rows(ids), w[ids])
    # The kernel applied to the identity gives the weight it actually uses:
    # the same as ``rows`` up to bf16 output.
    assert (module(torch.eye(576)).T - w).abs().max() < 0.02
    # bfloat16 activations skip the casts and the reshape: the same kernel call, the same numbers
    assert torch.equal(module(x.bfloat16()), module(x.bfloat16()[None])[0])
    assert torch.equal(module(x.bfloat16()).float(), module(x.bfloat16().float()).float())


# ---------------------------------------------------------------- AWQ on real activations


@pytest.fixture(scope="module")
def real_layer_inputs():
    """The float model, and the inputs of layer 3 (its residual stream) and of its MLP linears on 256 tokens
    of the evaluation text."""
    from solutions.model.llama import LlamaModel
    from solutions.model.loader import load_weights

    weights = load_weights()
    model = LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    ids = torch.tensor(weights.tokenizer.encode(EVAL_TEXT.read_text())[:256])
    layer = model.layers[3]
    captured = {}

    def grab(name):
        def hook(module, args):  # returns None, so the forward goes on with its own arguments
            captured.setdefault(name, args[0])

        return hook

    hooks = [
        layer.input_layernorm.register_forward_pre_hook(
            lambda m, args: captured.setdefault("layer", sum(args))
        ),
        layer.mlp.gate_up_proj.register_forward_pre_hook(grab("gate_up")),
        layer.mlp.down_proj.register_forward_pre_hook(grab("down")),
    ]
    with torch.inference_mode():
        model.sequence_logits(ids)
    for hook in hooks:
        hook.remove()
    return model, weights, captured


def awq_scales(x: torch.Tensor, alpha: float) -> torch.Tensor:
    s = x.abs().mean(0).pow(alpha).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


@pytest.mark.lab6
def test_scale_search_survives_a_channel_that_never_fires(load):
    """Real calibration activations have channels that stay 0 (a dead feature, a padded dimension): mean|x|
    is 0 there, so s = 0 ** alpha = 0 for every alpha > 0 unless it is clamped, and the normalisation then
    divides by sqrt(max(s) * min(s)) = 0."""
    awq = load("quant.awq")
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(32, 64, generator=gen)
    x = torch.randn(48, 64, generator=gen) * (1 + 20 * (torch.rand(64, generator=gen) < 0.1))
    x[:, 5] = 0.0
    result = awq.search_scale(weight, x, 4, 32, n_grid=5)
    bad = [a for a, e in zip(result.alphas, result.errors, strict=True) if not math.isfinite(e)]
    assert not bad and bool(torch.isfinite(result.scales).all()), (
        f"with input channel 5 always 0, the errors at alphas {bad} are inf or NaN. Likely: s = "
        "mean|x| ** alpha not clamped (clamp(min=1e-4)) before the normalisation by sqrt(max(s) * min(s)): "
        "a zero channel makes s = 0 there, and 0 / 0"
    )
    assert result.alpha > 0, (
        f"chose alpha {result.alpha}: with outlier channels some alpha > 0 beats round-to-nearest, once a "
        "dead channel's scale is clamped"
    )


@pytest.mark.lab6
def test_scale_search_measures_the_error_after_block(load):
    """``block`` maps the linear's output to the block's output (an MLP, attention):
    the error is measured there."""
    awq, rtn = load("quant.awq"), load("quant.rtn")
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(48, 128, generator=gen)
    outliers = 1 + 30 * (
        torch.rand(128, generator=gen) < 0.05
    )  # a few large activation channels, as in real models
    x = torch.randn(64, 128, generator=gen) * outliers
    proj = torch.randn(48, 16, generator=gen)
    block = lambda y: torch.nn.functional.silu(y) @ proj

    result = awq.search_scale(weight, x, 4, 32, n_grid=5, block=block)
    assert result.alphas == [0.0, 0.2, 0.4, 0.6, 0.8], (
        f"alphas {result.alphas}: the grid is i / n_grid for i in range(n_grid), so 1.0 is not on it"
    )
    for alpha, error in zip(result.alphas, result.errors):
        s = awq_scales(x, alpha)
        w_q = rtn.fake_quantize(weight * s, 4, 32) / s
        after_block = (block(x @ w_q.T) - block(x @ weight.T)).pow(2).mean().item()
        before_block = (x @ w_q.T - x @ weight.T).pow(2).mean().item()
        if error == pytest.approx(before_block, rel=1e-4):
            raise AssertionError(
                f"at alpha {alpha} the error {error:.4g} is the linear's own output error: block was "
                "ignored. Pass both outputs through block (the identity only when block is None)"
            )
        assert error == pytest.approx(after_block, rel=1e-4), (
            f"at alpha {alpha}: error {error:.4g}, expected {after_block:.4g} "
            "= mean((block(x W_q^T) - block(x W^T))**2) with s = mean|x|**alpha, clamped at 1e-4 and divided "
            "by sqrt(max(s) * min(s))"
        )
    best = result.errors.index(min(result.errors))
    assert result.alpha == result.alphas[best], (
        f"alpha {result.alpha} returned, but {result.alphas[best]} had the lowest error"
    )
    same_scales = torch.allclose(result.scales, awq_scales(x, result.alpha))
    assert same_scales, "scales must be the ones at the chosen alpha"


@pytest.mark.lab6
@pytest.mark.slow
@pytest.mark.parametrize(
    "linear, w_bit",
    [
        pytest.param("gate_up", 4, id="gate_up-int4"),
        pytest.param("down", 4, id="down-int4"),
        pytest.param("down", 3, id="down-int3"),
    ],
)
def test_scale_search_beats_round_to_nearest(load, real_layer_inputs, linear, w_bit):
    awq, rtn = load("quant.awq"), load("quant.rtn")
    model, _, captured = real_layer_inputs
    mlp = model.layers[3].mlp
    weight = (mlp.gate_up_proj if linear == "gate_up" else mlp.down_proj).weight
    x = captured[linear]
    result = awq.search_scale(weight, x, w_bit, 64, n_grid=10)
    assert result.alphas == [i / 10 for i in range(10)] and len(result.errors) == 10, (
        "one error per alpha i / n_grid"
    )
    assert result.scales.shape == (weight.shape[1],), (
        f"scales {tuple(result.scales.shape)}: one per input channel"
    )
    positive = bool((result.scales > 0).all())
    assert positive, "scales must be positive (clamp mean|x|**alpha at 1e-4)"
    rtn_error = (x @ rtn.fake_quantize(weight, w_bit, 64).T - x @ weight.T).pow(2).mean().item()
    assert result.errors[0] == pytest.approx(rtn_error, rel=1e-4), (
        "alpha = 0 means s = 1: its error is plain RTN's"
    )
    assert result.alpha > 0 and min(result.errors) < rtn_error, "on real activations some alpha > 0 beats RTN"
    assert result.errors[result.alphas.index(result.alpha)] == min(result.errors), (
        "return the alpha with least error"
    )
    s = result.scales
    awq_error = (x @ (rtn.fake_quantize(weight * s, w_bit, 64) / s).T - x @ weight.T).pow(2).mean().item()
    assert awq_error == pytest.approx(min(result.errors), rel=1e-4)


@pytest.mark.slow
def test_awq_block_output_error_below_rtn(real_layer_inputs):
    """A whole decoder layer with the cached AWQ scales and clips, on held-out text, against RTN and float."""
    from solutions.quant.awq import load_awq_params
    from solutions.quant.model import quantize_model

    model, weights, captured = real_layer_inputs
    x = captured["layer"]
    cos, sin = model.rope_cos[: len(x)], model.rope_sin[: len(x)]

    def causal(layer, q, k, v):
        from solutions.kernels.attention import gqa_attention

        return gqa_attention(*[t.transpose(0, 1)[None] for t in (q, k, v)], causal=True)[0].transpose(0, 1)

    def layer_output(net):
        with torch.inference_mode():
            hidden, residual = net.layers[3](x, None, cos, sin, causal)
            return hidden + residual

    expected = layer_output(model)
    errors = {}
    for method in ("rtn", "awq"):
        params = load_awq_params(weights.source.stem, 4, 64) if method == "awq" else None
        net = quantize_model(copy.deepcopy(model), method, 4, 64, params)
        errors[method] = (layer_output(net) - expected).pow(2).mean().item()
    assert errors["awq"] < 0.8 * errors["rtn"], errors


# ---------------------------------------------------------------- the engine and the CLI


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rtn", "awq"])
def test_quantized_engine_generates_like_float(llm, method):
    """Greedy text from the packed engine is fluent and, fed the float model's own continuation, it
    mostly picks the float model's next token (free-running text drifts apart soon at 135M params)."""
    from solutions import LLM, SamplingParams

    prompt = "The history of the printing press begins"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    reference = llm.generate(prompt, params)[0].outputs[0].token_ids
    quant = LLM(device="cpu", dtype="float32", max_num_seqs=16, max_model_len=256, quantization=method)
    text = (
        quant.generate(prompt, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
        .outputs[0]
        .text
    )
    words = text.split()
    assert len(words) >= 12 and sum(w.strip(".,;:!?'\"()").isalpha() for w in words) >= 0.8 * len(words), text
    assert max(words.count(w) for w in words) <= 8, text  # not stuck repeating itself
    prompt_ids = quant.tokenizer.encode(prompt)
    prefixes = [prompt_ids + reference[:k] for k in range(16)]
    picks = [
        o.outputs[0].token_ids[0]
        for o in quant.generate(prefixes, SamplingParams(temperature=0, max_tokens=1))
    ]
    agree = sum(p == reference[k] for p, k in zip(picks, range(16)))
    assert agree >= 8, f"{method}: {agree}/16 next tokens match float's"


def test_engine_config_validates_quantization():
    from solutions.config import EngineConfig
    from solutions.kernels.cpu_linear import native_bf16

    # "auto": float32 on CPU, except a quantized model on a CPU with native bfloat16
    # (the int4 kernel's own dtype)
    assert EngineConfig(device="cpu").dtype == "float32"
    assert EngineConfig(device="cpu", quantization="rtn").dtype == (
        "bfloat16" if native_bf16() else "float32"
    )
    assert EngineConfig(device="cpu", quantization="rtn", dtype="float32").dtype == "float32"

    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(quantization="gptq")
    with pytest.raises(ValueError, match="w_bit"):
        EngineConfig(quantization="rtn", w_bit=8)
    with pytest.raises(ValueError, match="group_size"):
        EngineConfig(quantization="rtn", group_size=0)


def test_missing_awq_scales_say_how_to_compute_them(load):
    awq = load("quant.awq")
    with pytest.raises(
        FileNotFoundError, match=r"python -m solutions calibrate-awq --w-bit 2 --group-size 32"
    ):
        awq.load_awq_params("SmolLM2-135M-Instruct.Q4_1", 2, 32)


@pytest.mark.slow
def test_perplexity_cli_prints_the_figure_last():
    from solutions.__main__ import main

    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            main(["perplexity", "--file", str(EVAL_TEXT), "--quantization", "rtn", "--max-tokens", "128"])
            == 0
        )
    last = out.getvalue().strip().splitlines()[-1]
    assert last.startswith("perplexity: ") and 1 < float(last.split()[-1]) < 100
