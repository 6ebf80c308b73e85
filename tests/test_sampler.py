"""The sampler on tensors: min-p / top-k / top-p thresholds against a float64 sort, the draws' distribution,
the persistent per-row settings (written once, seeded rows the same alone and batched), and the sampled
speculative verify fed by them staying lossless."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from solutions.engine.sampling_batch import SamplingBatch
from solutions.kernels import sampling
from solutions.sampling_params import SamplingParams
from solutions.speculative import rejection

CPU = torch.device("cpu")


def reference_kept(row: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The kept set by the definition, in float64 with a full sort: min-p, then top-k, then the smallest
    prefix (largest first) of what is left whose renormalised probability reaches top_p; a token tied with
    the set's lowest kept logit stays."""
    logits = row.double()
    threshold = -math.inf
    if min_p > 0:
        threshold = float(logits.max()) + math.log(min_p)
    ranked = torch.sort(logits, descending=True).values
    if 0 < top_k < len(ranked):
        threshold = max(threshold, float(ranked[top_k - 1]))
    if top_p < 1:
        left = ranked[ranked >= threshold]
        covered = torch.softmax(left, dim=0).cumsum(0)
        boundary = min(int((covered < top_p).sum()), len(left) - 1)
        threshold = max(threshold, float(left[boundary]))
    return logits >= threshold


def near_a_boundary(row: torch.Tensor, top_p: float, kept: torch.Tensor) -> bool:
    """Whether the nucleus's cut sits within rounding of ``top_p`` (where float32 and float64 may differ)."""
    probs = torch.softmax(row.double(), dim=0)
    mass = float(probs[kept].sum())
    lowest = float(probs[kept].min())
    return abs(mass - top_p) < 1e-5 or abs(mass - lowest - top_p) < 1e-5


@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(2, 3000),
    scale=st.floats(0.01, 20.0),
    top_k=st.integers(-1, 400),
    top_p=st.floats(0.01, 1.0),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 0.5)),
    ties=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_thresholds_keep_exactly_the_sorted_definitions_set(seed, vocab, scale, top_k, top_p, min_p, ties):
    """Min-p, top-k and top-p (a radix select, no sort) keep the very set a float64 sort defines, ties at the
    boundary included (rounded logits make many), whatever the sizes and the spread of the logits."""
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(vocab, generator=g) * scale
    if ties:
        row = (row * 2).round() / 2
    filtered = sampling.filter_top_k_top_p(row[None], [top_k], [top_p], [min_p])[0]
    want = reference_kept(row, top_k, top_p, min_p)
    got = torch.isfinite(filtered)
    if not torch.equal(got, want):
        assert top_p < 1 and near_a_boundary(row, top_p, want), (
            f"kept {int(got.sum())} tokens, the definition keeps {int(want.sum())}"
        )
    assert torch.equal(filtered[got], row[got]), "kept logits pass through unchanged"


def test_a_wide_nucleus_is_found_without_candidates_and_a_batch_mixes_filters():
    """A flat row's nucleus holds most of a 49k vocabulary (far past any top-k prefilter); rows of one batch
    each get their own filter, and rows without one keep everything."""
    g = torch.Generator().manual_seed(1)
    vocab = 49152
    flat, peaked = torch.randn(vocab, generator=g) * 0.3, torch.randn(vocab, generator=g) * 6
    rows = torch.stack([flat, peaked, flat, peaked, flat])
    top_k, top_p, min_p = [0, 0, 50, 0, 0], [0.95, 0.9, 0.8, 1.0, 1.0], [0.0, 0.0, 0.0, 0.05, 0.0]
    filtered = sampling.filter_top_k_top_p(rows, top_k, top_p, min_p)
    for i in range(len(rows)):
        assert torch.equal(
            torch.isfinite(filtered[i]), reference_kept(rows[i], top_k[i], top_p[i], min_p[i])
        ), i
    assert int(torch.isfinite(filtered[0]).sum()) > 40000, "the flat row's nucleus is most of the vocabulary"
    assert torch.isfinite(filtered[4]).all()


def test_top_p_threshold_edge_cases():
    """Excluded (-inf) tokens never count; a top_p of nearly 1 keeps every token even when the float sum
    falls a hair short of it; a tiny one keeps the most likely token alone; negative and positive logits."""
    row = torch.tensor([[-3.0, 2.0, float("-inf"), 0.5, -0.25, float("-inf"), 1.0]])
    assert sampling.top_p_threshold(row, torch.tensor([1e-6])).tolist() == [2.0]
    assert float(sampling.top_p_threshold(row, torch.tensor([1.0]))) <= -3.0, "every finite token stays"
    probs = torch.softmax(row[0].double(), 0)
    cut = float(probs[1] + probs[6]) + 1e-9  # just past the two largest: the third joins
    assert sampling.top_p_threshold(row, torch.tensor([cut])).tolist() == [0.5]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.8),
        SamplingParams(temperature=0.9, min_p=0.1),
        SamplingParams(temperature=1.1, top_k=7, top_p=0.9, min_p=0.02),
    ],
    ids=["temperature", "top-k", "top-p", "min-p", "all"],
)
def test_draws_follow_the_float64_distribution(params):
    """Chi-square of 40,000 draws (``filtered_probs`` then ``sample``) against the float64 definition's
    probabilities: the renormalised softmax of logits / T over the kept set."""
    g = torch.Generator().manual_seed(3)
    vocab, draws = 12, 40000
    logits = torch.randn(vocab, generator=g) * 2
    scaled = logits.double() / params.temperature
    kept = reference_kept(scaled, params.top_k, params.top_p, params.min_p)
    expected = torch.softmax(scaled.masked_fill(~kept, -math.inf), 0) * draws
    probs = sampling.filtered_probs(logits[None], sampling.RowSettings.of([params], vocab, CPU))
    probs = probs.expand(draws, vocab)
    tokens = sampling.sample(probs, torch.rand(draws, dtype=torch.float64, generator=g))
    counts = torch.bincount(tokens, minlength=vocab).double()
    assert torch.all(counts[~kept] == 0), "a filtered-out token was drawn"
    observed, wanted = counts[kept], expected[kept]
    chi2 = float(((observed - wanted) ** 2 / wanted).sum())
    dof = int(kept.sum()) - 1
    # p < 0.001: the chi-square quantile by Wilson-Hilferty.
    limit = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3 if dof else 0.0
    assert chi2 <= limit, f"chi-square {chi2:.1f} over {dof} dof (limit {limit:.1f})"


def test_greedy_rows_are_one_hot_beside_sampled_ones():
    logits = torch.tensor([[0.1, 3.0, 2.9], [0.1, 3.0, 2.9]])
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_p=0.99)]
    probs = sampling.sampling_probs(logits, params)
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    assert float(probs[1, 2]) > 0.4


def test_min_p_is_validated():
    SamplingParams(min_p=0.0), SamplingParams(min_p=1.0)
    for bad in (-0.1, 1.5, "0.1"):
        with pytest.raises(ValueError, match="min_p must be in"):
            SamplingParams(min_p=bad)


# -- the persistent settings ---------------------------------------------------------------------------------


class Row:
    """What ``SamplingBatch`` reads of a request."""

    def __init__(self, params: SamplingParams, num_tokens: int = 5, index: int = 0):
        self.params, self.num_tokens, self.index, self.finished = params, num_tokens, index, False
        self.num_pending = 0


def test_settings_are_written_once_per_request_and_rows_are_reused():
    """A request's settings reach the device the step it is first sampled; later steps send only the row
    indices and counters. A finished request's row goes to the next newcomer; more requests than rows grow
    the buffers, their rows kept."""
    batch = SamplingBatch(vocab_size=50, device=CPU, rows=2)
    a, b = Row(SamplingParams(temperature=0.5, top_k=3, seed=7)), Row(SamplingParams(top_p=0.5))
    batch.sample_rows([a, b], [0, 1])
    assert not batch._dirty
    batch.sample_rows([b, a], [0, 1])
    assert not batch._dirty, "no settings written for requests that already have rows"
    a.finished = True
    c = Row(SamplingParams(min_p=0.2))
    got = batch.sample_rows([b, c], [0, 1])
    assert batch.row_of[c] == 0 and a not in batch.row_of, "c took the finished request's row"
    d = Row(SamplingParams(temperature=0))
    got = batch.sample_rows([b, c, d], [0, 1, 2])
    assert len(batch.owner) == 4
    s = got.settings
    assert s.top_p.tolist() == [0.5, 1.0, 1.0] and s.min_p.tolist() == pytest.approx([0.0, 0.2, 0.0])
    assert s.greedy.tolist() == [False, False, True] and s.temperature.tolist() == [1.0, 1.0, 1.0]
    assert (s.max_top_k, s.uses_top_p, s.uses_min_p, s.any_greedy) == (0, True, True, True)


def test_a_seeded_rows_numbers_are_the_same_alone_and_batched():
    """Seeded rows draw ``counter_uniforms(seed + completion index, position)`` wherever they sit."""
    seeded = Row(SamplingParams(seed=11), num_tokens=9, index=2)
    alone = SamplingBatch(50, CPU).sample_rows([seeded], [0]).uniform
    others = [Row(SamplingParams()) for _ in range(3)]
    batched = SamplingBatch(50, CPU).sample_rows([others[0], seeded, *others[1:]], [0, 1, 2, 3]).uniform
    expected = sampling.counter_uniforms(torch.tensor([13]), torch.tensor([9]))
    assert float(alone[0]) == float(batched[1]) == float(expected[0])


def test_chain_rows_lay_out_a_verify():
    """Short chains repeat their last logits row; draw numbers count at each row's token position, acceptance
    numbers in their own stream."""
    batch = SamplingBatch(50, CPU)
    a, b = Row(SamplingParams(seed=1), num_tokens=10), Row(SamplingParams(temperature=0.5), num_tokens=4)
    chains = batch.chain_rows([a, b], [[7, 8, 9], [3]], [0, 4])
    assert chains.logits_index.tolist() == [0, 1, 2, 3, 4, 5, 5, 5]
    assert chains.drafts.tolist() == [[7, 8, 9], [3, 0, 0]] and chains.num_drafts.tolist() == [3, 1]
    seeds = torch.full((4,), 1)
    assert torch.equal(chains.draw_uniform[0], sampling.counter_uniforms(seeds, torch.arange(10, 14)))
    accept = sampling.counter_uniforms(seeds[:3], torch.arange(10, 13) + sampling.ACCEPT_STREAM)
    assert torch.equal(chains.accept_uniform[0], accept)


def test_sampled_verify_on_counter_numbers_is_lossless():
    """Speculative rounds over a two-token Markov chain with the engine's inputs (``chain_rows``: seeded
    counter numbers, each used once) give the target's own distribution of 3-token continuations: the
    empirical frequencies match the exact float64 probabilities (chi-square)."""
    vocab, k, rounds = 4, 2, 4000
    g = torch.Generator().manual_seed(5)
    p_logits, q_logits = torch.randn(vocab, vocab, generator=g), torch.randn(vocab, vocab, generator=g)
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=0)
    p_table = sampling.sampling_probs(p_logits, [params] * vocab).double()
    q_table = torch.softmax(q_logits.double(), -1)
    counts = torch.zeros(vocab, vocab, vocab)
    batch = SamplingBatch(vocab, CPU)
    for r in range(rounds):
        request = Row(SamplingParams(temperature=0.9, top_p=0.9, seed=r), num_tokens=1)
        tokens = [0]
        while len(tokens) < 4:
            drafts, q = [], []
            for _ in range(k):
                dist = q_table[(drafts or tokens)[-1]]
                q.append(dist)
                drafts.append(int(torch.multinomial(dist, 1, generator=g)))
            chains = batch.chain_rows([request], [drafts], [0])
            context = [tokens[-1], *drafts]
            logits = p_logits[context].index_select(0, chains.logits_index)
            p = sampling.filtered_probs(logits, chains.settings).view(1, k + 1, vocab)
            num, nxt = rejection.verify(
                chains.drafts,
                p,
                torch.stack(q)[None].float(),
                chains.num_drafts,
                uniforms=(chains.accept_uniform, chains.draw_uniform),
            )
            tokens += drafts[: int(num[0])] + [int(nxt[0])]
            request.num_tokens = len(tokens)
        counts[tokens[1], tokens[2], tokens[3]] += 1
        request.finished = True
    expected = (p_table[0][:, None, None] * p_table[:, :, None] * p_table[None, :, :]).flatten() * rounds
    observed, nonzero = counts.flatten().double(), expected.flatten() > 0
    assert torch.all(observed[~nonzero] == 0)
    chi2 = float(((observed[nonzero] - expected[nonzero]) ** 2 / expected[nonzero]).sum())
    dof = int(nonzero.sum()) - 1
    limit = dof * (1 - 2 / (9 * dof) + 3.09 * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 <= limit, f"chi-square {chi2:.1f} over {dof} dof (limit {limit:.1f})"
