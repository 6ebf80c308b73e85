"""Lesson 5: the router and its balance loss, the permutation, the grouped expert kernel,
Mixtral checkpoints."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from kernel_device import KERNEL_DEVICE

# ---------------------------------------------------------------- router and balance loss (Lab 5)


def rounded(t: torch.Tensor) -> list:
    return [[round(x, 3) for x in row] for row in t.tolist()]


def expect_close_lists(actual: torch.Tensor, expected: torch.Tensor, what: str, likely: str) -> None:
    """Compare small tensors as rounded lists, so a failure reads as numbers and a likely cause."""
    if actual.shape != expected.shape or not torch.allclose(actual.float(), expected.float(), atol=1e-5):
        raise AssertionError(f"{what}: got {rounded(actual)}, expected {rounded(expected)}. Likely: {likely}")


@pytest.mark.lab5
def test_route_picks_top_k_and_renormalises_by_hand(load):
    router = load("model.moe_router")
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    routing = router.route(probs.log(), top_k=2)
    assert routing.experts.tolist() == [[1, 2], [0, 2]], (
        f"chosen experts {routing.experts.tolist()}, expected [[1, 2], [0, 2]]: each token's top_k experts "
        "by probability over the experts (the last dim), most probable first"
    )
    expect_close_lists(
        routing.probs, probs, "probs", "softmax over the experts (dim=-1) of every token's logits, in float32"
    )
    expect_close_lists(
        routing.weights,
        torch.tensor([[0.6 / 0.9, 0.3 / 0.9], [0.5 / 0.8, 0.3 / 0.8]]),
        "weights with renormalize=True",
        "the top_k probabilities divided by their sum, so each token's weights add up to 1",
    )
    raw = router.route(probs.log(), top_k=2, renormalize=False)
    expect_close_lists(
        raw.weights,
        torch.tensor([[0.6, 0.3], [0.5, 0.3]]),
        "weights with renormalize=False",
        "the top_k probabilities themselves (renormalize only when asked)",
    )


@pytest.mark.lab5
def test_route_computes_in_float32_and_names_bad_k(load):
    router = load("model.moe_router")
    logits = torch.randn(5, 4, dtype=torch.bfloat16)
    routing = router.route(logits, top_k=4)
    assert routing.weights.dtype == torch.float32 and routing.probs.dtype == torch.float32, (
        f"weights {routing.weights.dtype}, probs {routing.probs.dtype} from bfloat16 logits: softmax in "
        "float32 (logits.float()); bfloat16 keeps 8 bits of mantissa, too few to rank close experts"
    )
    assert routing.experts.dtype == torch.int64, f"experts must be int64 indices, got {routing.experts.dtype}"
    expect_close_lists(
        routing.weights.sum(-1, keepdim=True), torch.ones(5, 1), "each token's weights summed", "renormalise"
    )
    assert sorted(routing.experts[0].tolist()) == [0, 1, 2, 3], "with top_k = E every expert is chosen once"
    with pytest.raises(ValueError, match="top_k"):
        router.route(logits, top_k=5)


@pytest.mark.lab5
def test_route_on_bfloat16_logits_ranks_and_weighs_as_float32_does(load):
    """A bfloat16 model's router gives bfloat16 logits. Close experts (logits within a few hundredths) are
    ranked and weighed by their float32 probabilities: a softmax taken in bfloat16 and cast afterwards rounds
    the probabilities to 8 bits of mantissa first, so near-ties swap and the weights are off by about 0.3%."""
    router = load("model.moe_router")
    gen = torch.Generator().manual_seed(12)
    logits = (torch.randn(512, 8, generator=gen) * 0.3).to(torch.bfloat16)
    logits = logits[torch.tensor([len(set(row)) == 8 for row in logits.tolist()])]  # no exact ties
    routing = router.route(logits, top_k=2)
    probs = torch.softmax(logits.double(), dim=-1)
    weights, experts = probs.topk(2, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    swapped = int((routing.experts != experts).any(-1).sum())
    weight_err = float(((routing.weights.double() - weights).abs() / weights).max())
    prob_err = float(((routing.probs.double() - probs).abs() / probs).max())
    assert swapped == 0 and weight_err < 1e-5 and prob_err < 1e-5, (
        f"route on bfloat16 logits: compute the softmax and the top-k in float32 (router_logits.float()), "
        f"not in the logits' bfloat16 with a cast afterwards: {swapped} of {len(logits)} tokens got other "
        f"experts than float32 ranks first, weights off by up to {weight_err:.2%}, probs by {prob_err:.2%}"
    )


@pytest.mark.lab5
def test_balance_loss_against_hand_computed_values(load):
    router = load("model.moe_router")
    # 4 tokens, 2 experts, top-1: experts [0, 0, 0, 1] -> f = [3/4, 1/4]
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    routing = router.route(probs.log(), top_k=1)
    p_mean = [(0.9 + 0.8 + 0.6 + 0.3) / 4, (0.1 + 0.2 + 0.4 + 0.7) / 4]
    expected = 0.01 * 2 * (0.75 * p_mean[0] + 0.25 * p_mean[1])
    loss = router.load_balancing_loss(routing, alpha=0.01).item()
    assert math.isclose(loss, expected, rel_tol=1e-6), (
        f"top-1 of 2 experts, choices [0, 0, 0, 1]: loss {loss:.6f}, expected {expected:.6f} "
        "= alpha * E * sum(f * P) with f = [3/4, 1/4] (the share of assignments each expert got) and P "
        "the mean probability per expert"
    )
    # top-2 of 3 experts: the 6 assignments [0, 1, 0, 1, 2, 1] -> f = [2/6, 3/6, 1/6]
    # (first choices alone: [2/3, 0, 1/3])
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1], [0.2, 0.3, 0.5]])
    routing = router.route(probs.log(), top_k=2)
    p_mean = [1.3 / 3, 0.9 / 3, 0.8 / 3]
    expected = 1.0 * 3 * (2 / 6 * p_mean[0] + 3 / 6 * p_mean[1] + 1 / 6 * p_mean[2])
    loss = router.load_balancing_loss(routing, alpha=1.0).item()
    assert math.isclose(loss, expected, rel_tol=1e-6), (
        f"top-2 of 3 experts: loss {loss:.6f}, expected {expected:.6f}: f counts all T * k assignments "
        "(here 6: f = [2/6, 3/6, 1/6]), not only each token's first choice, and divides by T * k"
    )


@pytest.mark.lab5
def test_balance_loss_is_alpha_when_uniform_and_alpha_e_when_collapsed(load):
    router = load("model.moe_router")
    experts = 4
    uniform = router.route(torch.eye(experts) * 1e-3, top_k=1)  # each token its own expert, probs ~ 1/E
    balanced = router.load_balancing_loss(uniform, alpha=0.5).item()
    assert math.isclose(balanced, 0.5, rel_tol=1e-3), (
        f"perfectly balanced routing gives {balanced:.4f}, expected alpha = 0.5: E * sum(f * P) is 1 there "
        "(is the factor E missing, or f and P not shares that sum to 1?)"
    )
    collapsed = router.route(torch.tensor([[30.0, 0, 0, 0]] * 6), top_k=1)
    one_expert = router.load_balancing_loss(collapsed, alpha=0.5).item()
    assert math.isclose(one_expert, 0.5 * experts, rel_tol=1e-3), (
        f"every token on one expert gives {one_expert:.4f}, expected alpha * E = {0.5 * experts}"
    )


@pytest.mark.lab5
def test_balance_loss_gradient_flows_through_the_probabilities_only(load):
    router = load("model.moe_router")
    logits = torch.randn(16, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    loss = router.load_balancing_loss(router.route(logits, top_k=2))
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0, (
        "no gradient reached the router logits: P (the mean probabilities) must stay a differentiable tensor "
        "(no .item(), .tolist() or torch.tensor(...) on it); f is the count part, without gradient"
    )


def test_capacity_drops_assignments_past_each_experts_slots(load):
    router = load("model.moe_router")
    assert router.expert_capacity(num_tokens=10, num_experts=4, top_k=2, capacity_factor=1.0) == 5
    assert router.expert_capacity(num_tokens=10, num_experts=4, top_k=1, capacity_factor=1.25) == 4
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    keep = router.capacity_mask(experts, num_experts=3, capacity=2)
    # first choices fill first: expert 0 takes tokens 0 and 1, drops token 2; then second choices: expert 1
    # has token 3 (first choice) + token 0 -> full, drops token 2's; expert 0 is full: drops token 3's.
    assert keep.tolist() == [[True, True], [True, True], [False, False], [True, False]]
    with pytest.raises(ValueError, match="capacity_factor"):
        router.expert_capacity(4, 2, 1, 0.0)


# ---------------------------------------------------------------- permutation (Lab 5)


def _check_permutation(perm, experts, num_experts, block):
    flat = experts.flatten().tolist()
    padding = len(flat)
    ids = perm.sorted_ids.tolist()
    case = f"{experts.shape[0]} tokens, top-{experts.shape[1]}, {num_experts} experts, block {block}"
    assert len(ids) == block * len(perm.block_experts) and len(ids) >= len(flat) + num_experts * (
        block - 1
    ), (
        f"{case}: {len(ids)} sorted_ids for {len(perm.block_experts)} blocks: size the buffers for the worst "
        "case (T * k + E * (block - 1) rows, rounded up to whole blocks), one block_experts entry per block"
    )
    missing = sorted(set(range(len(flat))) - set(ids))
    assert sorted(i for i in ids if i != padding) == list(range(len(flat))), (
        f"{case}: every assignment 0..{len(flat) - 1} must appear exactly once in sorted_ids "
        f"(missing {missing[:5]}); padding rows hold T * k = {padding}"
    )
    for b, expert in enumerate(perm.block_experts.tolist()):
        rows = [i for i in ids[b * block : (b + 1) * block] if i != padding]
        if expert == -1:
            assert not rows, f"{case}: block {b} is marked -1 (padding only) but holds assignments {rows}"
        else:
            wrong = [i for i in rows if flat[i] != expert]
            assert rows and not wrong, (
                f"{case}: block {b} is expert {expert}'s, but holds assignments {wrong or 'none'} of other "
                "experts: each group starts at the padded cumulative count, so no block straddles two experts"
            )
    used = [e for e in perm.block_experts.tolist() if e != -1]
    assert used == sorted(used), (
        f"{case}: block_experts {used} must run in expert order, padding-only blocks last"
    )
    assert perm.counts.tolist() == [flat.count(e) for e in range(num_experts)], (
        f"{case}: counts {perm.counts.tolist()}: the number of assignments of each expert "
        "(bincount, minlength E)"
    )
    for e in range(num_experts):  # a group's rows keep the assignments' order (stable sort)
        rows = [i for i in ids if i != padding and flat[i] == e]
        assert rows == sorted(rows), (
            f"{case}: expert {e}'s rows {rows[:8]} are out of order: sort the expert ids with a stable sort "
            "(torch.argsort(..., stable=True)), so each group keeps its assignments in token order"
        )


@pytest.mark.lab5
def test_permutation_by_hand(load):
    permute = load("kernels.moe_permute")
    experts = torch.tensor([[2, 0], [0, 2], [0, 1]])  # flat [2, 0, 0, 2, 0, 1]
    perm = permute.permute(experts, num_experts=4, block=4)
    p = 6
    assert perm.sorted_ids.tolist()[:12] == [1, 2, 4, p, 5, p, p, p, 0, 3, p, p], (
        f"sorted_ids {perm.sorted_ids.tolist()[:12]}..., expected [1, 2, 4, P, 5, P, P, P, 0, 3, P, P] "
        "(P = 6): expert 0's assignments 1, 2, 4 padded to a block of 4, then expert 1's, then expert 2's"
    )
    assert perm.block_experts.tolist()[:3] == [0, 1, 2] and set(perm.block_experts.tolist()[3:]) <= {-1}, (
        f"block_experts {perm.block_experts.tolist()}, expected [0, 1, 2, -1, -1]: one expert per block, "
        "-1 for blocks of padding only (expert 3 got no token, so it has no block)"
    )


@pytest.mark.lab5
@pytest.mark.parametrize(
    "tokens, num_experts, top_k, block", [(1, 8, 2, 16), (37, 5, 2, 4), (64, 8, 1, 16), (9, 3, 3, 1)]
)
def test_permutation_invariants_on_random_routings(load, tokens, num_experts, top_k, block):
    permute = load("kernels.moe_permute")
    g = torch.Generator().manual_seed(tokens)
    experts = torch.rand(tokens, num_experts, generator=g).argsort(dim=1)[:, :top_k]
    _check_permutation(permute.permute(experts, num_experts, block), experts, num_experts, block)


@pytest.mark.lab5
def test_permutation_reads_no_value_back_to_the_host(load):
    """The fused MoE layer replays in a CUDA graph, which records no host sync: permute must size everything
    from the shapes alone. On the meta device, which holds shapes and no values, such code runs; code that
    reads a value back (bincount sizes its output by the largest id; .item(), .tolist()) cannot."""
    permute_mod = load("kernels.moe_permute")
    experts = torch.zeros(37, 2, dtype=torch.int64, device="meta")
    try:
        result = permute_mod.permute(experts, 5, 4)
    except (NotImplementedError, RuntimeError) as error:
        raise AssertionError(
            f"permute needs the values of the expert ids, not only their shape (on the meta device: "
            f"{str(error).splitlines()[0][:120]}). Likely: torch.bincount, which reads the largest id back "
            "to the host to size its output (a sync a CUDA graph cannot record): count with index_add_ into "
            "torch.zeros(num_experts)"
        ) from None
    rows = -(-(37 * 2 + 5 * 3) // 4) * 4
    assert tuple(result.sorted_ids.shape) == (rows,) and tuple(result.block_experts.shape) == (rows // 4,), (
        f"sorted_ids {tuple(result.sorted_ids.shape)}, block_experts {tuple(result.block_experts.shape)}: "
        f"sized for the worst case, {rows} rows in {rows // 4} blocks"
    )


@pytest.mark.lab5
def test_permutation_with_an_empty_expert_and_one_taking_all(load):
    permute = load("kernels.moe_permute")
    experts = torch.full((13, 1), 3)
    perm = permute.permute(experts, num_experts=5, block=4)
    _check_permutation(perm, experts, 5, 4)
    assert perm.block_experts.tolist()[:4] == [3, 3, 3, 3], (
        f"13 assignments all on expert 3 fill 4 blocks of 4, got block_experts {perm.block_experts.tolist()}"
    )


# ---------------------------------------------------------------- grouped kernel vs the per-expert loop

# Kernel tests run on KERNEL_DEVICE: compiled on a GPU, through the Triton interpreter on a CPU.
# Max error relative to the output's largest value, against the float64 loop: float32 keeps the fused
# SwiGLU's float32 intermediate; bfloat16 rounds its inputs, the [T * k, I] intermediate and the output.
MOE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _moe_inputs(tokens, hidden, width, num_experts, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(num_experts, 2 * width, hidden, generator=g) / hidden**0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, width, generator=g) / width**0.5).to(dtype)
    return x, w13, w2, g


def _top2_triton_error(moe_gemm, tokens: int, num_experts: int, seed: int) -> float:
    """Relative error of ``fused_moe_triton`` against the reference on a random top-2 routing (hidden 48,
    width 40)."""
    x, w13, w2, g = _moe_inputs(tokens, 48, 40, num_experts, seed=seed)
    experts = torch.rand(tokens, num_experts, generator=g).argsort(dim=1)[:, :2]
    weights = torch.rand(tokens, 2, generator=g)
    expected = moe_gemm.reference_moe(x, w13, w2, weights, experts)
    ours = moe_gemm.fused_moe_triton(x, w13, w2, weights, experts)
    return ((ours.double() - expected).abs().max() / expected.abs().max()).item()


def _routings(tokens, num_experts, top_k, g):
    random_pick = torch.rand(tokens, num_experts, generator=g).argsort(dim=1)[:, :top_k]
    no_expert_0 = torch.rand(tokens, num_experts - 1, generator=g).argsort(dim=1)[:, :top_k] + 1
    all_to_one = torch.stack(
        [torch.full((tokens,), num_experts - 1)] + [random_pick[:, 0] * 0 + j for j in range(top_k - 1)], 1
    )
    return {
        "random": random_pick,
        "an expert with no token": no_expert_0,
        "one expert takes every token": all_to_one,
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens, top_k", [(1, 2), (37, 2), (64, 1), (129, 3)])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_grouped_moe_matches_float64_per_expert_loop(load, tokens, top_k, backend, dtype):
    moe_gemm = load("kernels.moe_gemm")
    num_experts, hidden, width = 6, 48, 40  # widths off the kernel's tiles: masks are exercised
    x, w13, w2, g = _moe_inputs(tokens, hidden, width, num_experts, seed=tokens + top_k, dtype=dtype)
    device = KERNEL_DEVICE if backend == "triton" else torch.device("cpu")
    for name, experts in _routings(tokens, num_experts, top_k, g).items():
        weights = torch.rand(tokens, top_k, generator=g).to(dtype)
        expected = moe_gemm.reference_moe(x, w13, w2, weights, experts)
        args = [t.to(device) for t in (x, w13, w2, weights, experts)]
        ours = moe_gemm.fused_moe(*args, backend=backend)
        assert ours.dtype == x.dtype and ours.shape == x.shape and ours.device.type == device.type
        err = ((ours.cpu().double() - expected).abs().max() / expected.abs().max()).item()
        assert err < MOE_TOLERANCE[dtype], f"{backend} {name}: relative error {err:.2e} vs the float64 loop"


@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_grouped_gemm_computes_every_assignment_row(load, gated):
    """Each assignment's row, whatever block and padding it sits in; experts 0 and 2 get no token."""
    moe_gemm, permute = load("kernels.moe_gemm"), load("kernels.moe_permute")
    x, w13, _, g = _moe_inputs(21, 32, 24, 4, seed=3)
    experts = torch.tensor([1, 3])[torch.rand(21, 2, generator=g).argsort(dim=1)]  # two distinct of {1, 3}
    perm = permute.permute(experts.to(KERNEL_DEVICE), 4, 16)
    out = moe_gemm.grouped_gemm(x.to(KERNEL_DEVICE), w13.to(KERNEL_DEVICE), perm, 2, gated=gated).cpu()
    rows = torch.stack([x[a // 2].double() @ w13[experts.flatten()[a]].double().t() for a in range(42)])
    if gated:
        gate, up = rows.chunk(2, dim=-1)
        rows = torch.nn.functional.silu(gate) * up
    assert out.shape == rows.shape, f"grouped_gemm returned {tuple(out.shape)}, expected {tuple(rows.shape)}"
    err = ((out.double() - rows).abs().max() / rows.abs().max()).item()
    assert err < 1e-5, f"gated={gated}: relative error {err:.2e} against the per-assignment product"


def test_block_m_grows_with_rows_per_expert(load):
    block_m_for = load("kernels.moe_gemm").block_m_for
    # 8 experts, top-2: rows per expert = tokens / 4
    assert [block_m_for(t * 2, 8) for t in (1, 64, 128, 256, 4096)] == [16, 16, 32, 64, 128]


def test_autotune_candidates_fit_every_launch(load):
    """On CUDA the kernel is timed over candidates pruned per launch: at least one survives for every row
    block, gated or not, and each survivor's pipeline fits in shared memory (checked here without a GPU)."""
    moe_gemm = load("kernels.moe_gemm")
    configs = moe_gemm._grouped_gemm_autotuned.configs
    for dtype in (torch.bfloat16, torch.float32):
        for block_m in (16, 32, 64, 128):
            for gated in (False, True):
                named = {"a_ptr": torch.empty(0, dtype=dtype)}
                kept = moe_gemm._prune_configs(configs, named, BLOCK_M=block_m, GATED=gated)
                assert kept, f"no candidate for BLOCK_M={block_m}, gated={gated}, {dtype}"
                for c in kept:
                    n, k = c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
                    stage = (block_m * k + (2 if gated else 1) * k * n) * dtype.itemsize
                    fits = c.num_stages * stage <= moe_gemm.SHARED_MEMORY_BYTES
                    assert fits, f"{c} overflows shared memory at BLOCK_M={block_m}, gated={gated}, {dtype}"


@pytest.mark.interpreter  # on a GPU the compiled kernel runs this path for real
def test_grouped_gemm_autotuned_path_runs_under_a_cpu_timer(load, monkeypatch):
    """The CUDA launch path (the autotuner's key, the pruning by BLOCK_M and gating, the grid from the chosen
    BLOCK_N) driven through the interpreter with small candidates and a wall-clock timer."""
    import triton

    moe_gemm = load("kernels.moe_gemm")

    def timer(kernel_call, quantiles):
        start = time.perf_counter()
        kernel_call()
        return [time.perf_counter() - start] * len(quantiles)

    candidates = {16: [(64, 32, 4, 2), (32, 32, 4, 2)]}  # a gated launch halves the N tile: 32 and 16
    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": 32, "GROUP_SIZE_M": 2}, num_warps=4, num_stages=2)
               for n in (16, 32, 64)]  # fmt: skip
    pruning = {"early_config_prune": moe_gemm._prune_configs}
    key = ["N", "K", "BLOCK_M", "GATED"]
    autotune = triton.autotune(configs, key, prune_configs_by=pruning, do_bench=timer)
    tuned = autotune(moe_gemm._grouped_gemm_kernel)
    monkeypatch.setattr(moe_gemm, "autotunes_on", lambda device: True)
    monkeypatch.setattr(moe_gemm, "_CUDA_CANDIDATES", candidates)
    monkeypatch.setattr(moe_gemm, "_grouped_gemm_autotuned", tuned)
    err = _top2_triton_error(moe_gemm, tokens=37, num_experts=6, seed=5)
    assert err < 1e-5, f"through the autotuned path: relative error {err:.2e}"
    assert tuned.best_config.kwargs["BLOCK_N"] in (32, 64), "the down launch ran another launch's candidate"


@pytest.mark.interpreter  # on a GPU the compiled kernel runs this path for real
def test_grouped_gemm_untimed_cuda_path_runs_the_first_candidate(load, monkeypatch):
    """FASTMODE_AUTOTUNE=0 on CUDA runs each launch's first candidate untimed, driven here through the
    interpreter."""
    moe_gemm = load("kernels.moe_gemm")
    monkeypatch.setattr(moe_gemm, "autotunes_on", lambda device: True)
    monkeypatch.setenv("FASTMODE_AUTOTUNE", "0")
    err = _top2_triton_error(moe_gemm, tokens=21, num_experts=4, seed=13)
    assert err < 1e-5, f"FASTMODE_AUTOTUNE=0 path: relative error {err:.2e}"


def test_grouped_gemm_refuses_to_autotune_while_a_cuda_graph_captures(load, monkeypatch):
    """A launch never timed, met during a capture, fails naming the warm-up to do, not inside the capture."""
    moe_gemm = load("kernels.moe_gemm")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="never autotuned.*once eagerly"):
        moe_gemm._refuse_tuning_in_a_graph((56, 24, 16, True, torch.float32))


def test_bad_moe_inputs_are_named(load):
    moe_gemm, permute = load("kernels.moe_gemm"), load("kernels.moe_permute")
    x, w13, w2, _ = _moe_inputs(4, 16, 8, 3, seed=0)
    experts, weights = torch.tensor([[0], [1], [2], [3]]), torch.ones(4, 1)
    for backend in ("triton", "torch"):
        with pytest.raises(ValueError, match="expert ids"):
            moe_gemm.fused_moe(x, w13, w2, weights, experts, backend=backend)
    with pytest.raises(ValueError, match="do not fit"):
        moe_gemm.fused_moe(x[:, :8], w13, w2, weights, experts.clamp(max=2), backend="triton")
    with pytest.raises(ValueError, match="backend"):
        moe_gemm.fused_moe(x, w13, w2, weights, experts.clamp(max=2), backend="cuda")
    with pytest.raises(ValueError, match="16 rows or more"):
        moe_gemm.grouped_gemm(x, w13, permute.permute(experts.clamp(max=2), 3, 4), 1)
    with pytest.raises(ValueError, match="row_scale"):
        perm = permute.permute(experts.clamp(max=2), 3, 16)
        moe_gemm.grouped_gemm(x, w13, perm, 1, row_scale=torch.ones(3))


def test_bench_moe_smoke_prints_both_tables_and_the_goals(capsys):
    """``bench moe --smoke``: toy sizes, the kernel table through whatever device is here (the interpreter on
    a CPU); the figures mean nothing, the rows, the grouped path's error and the goal lines must be there."""
    from solutions.cli.bench.moe import main

    assert main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "goal at 16 tokens" in out and "goal: grouped >= 2x the per-expert loop" in out, out
    grouped = [line for line in out.splitlines() if line.startswith("32 x 48") and "grouped" in line]
    assert len(grouped) == 1 and float(grouped[0].split()[-1]) < 2e-2, f"grouped row or its error:\n{out}"


@pytest.mark.requires_cuda
def test_fused_moe_replays_in_a_cuda_graph(load):
    """With check_ids=False the layer reads nothing back to the host: captured once (after the eager call that
    autotunes), a graph replays it for new tokens and new routing and matches the eager result."""
    moe_gemm = load("kernels.moe_gemm")
    num_experts, tokens, top_k = 8, 5, 2
    x, w13, w2, g = _moe_inputs(tokens, 64, 96, num_experts, seed=7, dtype=torch.bfloat16)
    x, w13, w2 = x.cuda(), w13.cuda(), w2.cuda()

    def routing():
        experts = torch.rand(tokens, num_experts, generator=g).argsort(dim=1)[:, :top_k]
        return torch.rand(tokens, top_k, generator=g).to(torch.bfloat16).cuda(), experts.cuda()

    weights, experts = routing()
    layer = lambda: moe_gemm.fused_moe_triton(x, w13, w2, weights, experts, check_ids=False)  # noqa: E731
    layer()  # eager: compiles and autotunes outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer()
    new_weights, new_experts = routing()
    weights.copy_(new_weights)
    experts.copy_(new_experts)
    x.copy_(torch.randn(x.shape, generator=g).to(x))
    graph.replay()
    expected = moe_gemm.fused_moe_triton(x, w13, w2, weights, experts)
    assert torch.equal(captured, expected), "the replayed graph differs from an eager call on the same inputs"


# ---------------------------------------------------------------- Mixtral checkpoints against transformers


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory):
    """A randomly initialised Mixtral written by transformers, with no tokenizer files."""
    from transformers import MixtralConfig, MixtralForCausalLM

    folder = tmp_path_factory.mktemp("mixtral")
    torch.manual_seed(0)
    config = MixtralConfig(
        vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        rope_theta=10000.0, eos_token_id=None, bos_token_id=None,
    )  # fmt: skip
    model = MixtralForCausalLM(config).eval()
    with torch.no_grad():  # wider router logits than the default init, so routing differs from token to token
        for layer in model.model.layers:
            layer.mlp.gate.weight.mul_(20)
    model.save_pretrained(folder)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "mixtral"
    return model, folder


def test_mixtral_logits_match_transformers(load, tiny_mixtral):
    hf_model, folder = tiny_mixtral
    loader, llama = load("model.loader"), load("model.llama")
    weights = loader.load_weights(folder, load_tokenizer=False)
    assert (weights.config.num_local_experts, weights.config.num_experts_per_tok) == (4, 2)
    # The same weights on the CPU and on the kernel device (a GPU compiles the kernel: CPU tensors would not
    # reach it).
    model, on_device = (
        llama.LlamaModel.from_state_dict(weights.config, weights.state_dict, device, torch.float32)
        for device in ("cpu", KERNEL_DEVICE)
    )
    ids = torch.randint(0, 211, (23,), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = hf_model(ids[None]).logits[0]
        ours = model.sequence_logits(ids)
        for mlp in (layer.mlp for layer in on_device.layers):
            mlp.backend = "triton"
        on_kernel = on_device.sequence_logits(ids.to(KERNEL_DEVICE)).cpu()
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(on_kernel, expected, rtol=1e-4, atol=1e-5)


def test_mixtral_greedy_matches_hf_generate_batched_and_alone(load, tiny_mixtral):
    hf_model, folder = tiny_mixtral
    llm = load("llm").LLM(
        str(folder), skip_tokenizer_init=True, device="cpu", dtype="float32", max_num_seqs=4
    )
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 211, (n,), generator=g).tolist() for n in (5, 12, 1, 30)]
    expected = []
    for prompt in prompts:
        with torch.inference_mode():
            out = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=0
            )
        expected.append(out[0, len(prompt) :].tolist())
    batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate(p, params)[0].outputs[0].token_ids for p in prompts]
    assert batched == expected
    assert alone == expected


def test_engine_without_tokenizer_rejects_text_prompts(load, tiny_mixtral):
    _, folder = tiny_mixtral
    llm = load("llm").LLM(
        str(folder), skip_tokenizer_init=True, device="cpu", dtype="float32", max_num_seqs=1
    )
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        llm.generate("a text prompt")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load("llm").LLM(str(folder), device="cpu")


def test_unsupported_architectures_name_themselves(load):
    config = load("model.config")
    with pytest.raises(ValueError, match="qwen2_moe"):
        config.ModelConfig.from_hf_config({"model_type": "qwen2_moe"})
    mixtral = {"model_type": "mixtral", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
               "num_hidden_layers": 1, "num_attention_heads": 2, "num_local_experts": 4,
               "num_experts_per_tok": 5}  # fmt: skip
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        config.ModelConfig.from_hf_config(mixtral)
    with pytest.raises(ValueError, match="sliding"):
        config.ModelConfig.from_hf_config(
            {**mixtral, "num_experts_per_tok": 2, "sliding_window": 4096, "max_position_embeddings": 32768}
        )


def test_lab5_exercises_are_holes_in_labs():
    """In labs/, the router, its balance loss and the permutation raise until the learner writes them."""
    import importlib

    router, permute = (
        importlib.import_module("labs.model.moe_router"),
        importlib.import_module("labs.kernels.moe_permute"),
    )
    with pytest.raises(NotImplementedError, match="Lab 5"):
        router.route(torch.zeros(2, 4), top_k=2)
    with pytest.raises(NotImplementedError, match="Lab 5"):
        router.load_balancing_loss(None)
    with pytest.raises(NotImplementedError, match="Lab 5"):
        permute.permute(torch.zeros(2, 1, dtype=torch.long), num_experts=2, block=4)
