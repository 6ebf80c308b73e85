"""Lesson 4's components on tensors: exact rejection sampling, draft trees, n-gram lookup, the EAGLE head.

The end-to-end checks run a tiny random Llama (fast) through ``speculative.loop``: greedy speculative decoding
must reproduce plain greedy decoding token for token, whatever the drafter proposes.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test over cells with expected count >= 5 (the rest pooled into one cell)."""
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).double()
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def speculative_markov_samples(rejection, p_table, q_table, k, length, num, deterministic, generator):
    """``num`` sequences of ``length`` tokens after token 0 from a Markov 'target' ``p_table[prev]``, each
    drawn by speculative rounds: ``k`` drafts from ``q_table`` (sampled, or its argmax), then ``verify``."""
    seqs = torch.zeros(num, 1, dtype=torch.long)
    out = [[] for _ in range(num)]
    active = torch.arange(num)
    while len(active):
        prev = seqs[active, -1]
        drafts, q_rows = [], []
        last = prev
        for _ in range(k):
            q = q_table[last]
            token = q.argmax(-1) if deterministic else torch.multinomial(q, 1, generator=generator)[:, 0]
            drafts.append(token)
            q_rows.append(q)
            last = token
        drafts = torch.stack(drafts, 1)  # [B, k]
        contexts = torch.cat([prev[:, None], drafts], 1)  # the token before each verified position
        p = p_table[contexts]  # [B, k + 1, V]
        q = None if deterministic else torch.stack(q_rows, 1)
        num_accepted, next_token = rejection.verify(drafts, p, q, generators=generator)
        new_last = []
        for row, b in enumerate(active.tolist()):
            out[b] += drafts[row, : num_accepted[row]].tolist() + [int(next_token[row])]
            new_last.append(out[b][-1])
        seqs = torch.cat([seqs, torch.zeros(num, 1, dtype=torch.long)], 1)
        seqs[active, -1] = torch.tensor(new_last)
        active = torch.tensor([b for b in active.tolist() if len(out[b]) < length], dtype=torch.long)
    return torch.tensor([o[:length] for o in out])


@pytest.mark.lab4
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-drafts", "deterministic-drafts"])
def test_speculative_sampling_preserves_the_target_distribution(load, deterministic):
    """Chi-square over 3-token continuations: speculative samples follow the target's joint distribution,
    including its top-k / top-p truncation (cells the target forbids are never produced)."""
    rejection = load("speculative.rejection")
    vocab, length, num = 5, 3, 12000
    gen = torch.Generator().manual_seed(1)
    p_logits, q_logits = (
        torch.randn(vocab, vocab, generator=gen) * 1.5,
        torch.randn(vocab, vocab, generator=gen),
    )
    p_table = rejection.target_probs(p_logits, temperature=0.8, top_k=4, top_p=0.95)
    q_table = torch.softmax(q_logits, -1)
    samples = speculative_markov_samples(rejection, p_table, q_table, 2, length, num, deterministic, gen)
    cells = samples[:, 0] * vocab**2 + samples[:, 1] * vocab + samples[:, 2]
    observed = torch.bincount(cells, minlength=vocab**3).double()
    a, b, c = torch.meshgrid(torch.arange(vocab), torch.arange(vocab), torch.arange(vocab), indexing="ij")
    joint = (p_table[0][a] * p_table[a, b] * p_table[b, c]).flatten().double()
    forbidden = int(observed[joint == 0].sum())
    assert forbidden == 0, (
        f"{forbidden} of {num} continuations have target probability 0 (top-k/top-p cut them): a draft must "
        "be kept only with probability min(1, p/q), and the replacement drawn where p > 0"
    )
    p_value = chi_square_p_value(observed, joint * num)
    assert p_value > 1e-3, (
        f"speculative samples do not follow the target (chi-square p-value {p_value:.1e} over {num} "
        "3-token continuations): keep draft i when u * q_i(x_i) < p_i(x_i), stop at the first "
        "rejection, draw its replacement from norm(max(0, p - q)) at that position, and the token after "
        "the last kept draft from p"
    )


@pytest.mark.lab4
def test_greedy_verification_keeps_the_run_of_argmax_matches(load):
    rejection = load("speculative.rejection")
    logits = torch.full((2, 4, 10), -5.0)
    for b, argmaxes in enumerate([[3, 1, 4, 2], [7, 7, 0, 9]]):
        for i, t in enumerate(argmaxes):
            logits[b, i, t] = 5.0
    probs = rejection.target_probs(logits.view(8, 10), temperature=0).view(2, 4, 10)
    drafts = torch.tensor([[3, 1, 0], [7, 7, 0]])
    num, nxt = rejection.verify(drafts, probs)
    assert num.tolist() == [2, 3], (
        f"greedy: accepted {num.tolist()} drafts, expected [2, 3]: a draft is kept while it equals the "
        "target's argmax, and the run stops at the first that does not"
    )
    assert nxt.tolist() == [4, 9], (
        f"greedy: next tokens {nxt.tolist()}, expected [4, 9]: after a rejection, the target's argmax at "
        "that position (4); after all three drafts, the bonus token from the last row (9)"
    )
    num, nxt = rejection.verify(
        torch.tensor([[3, -1, -1], [8, -1, -1]]), probs, num_drafts=torch.tensor([1, 1])
    )
    assert (num.tolist(), nxt.tolist()) == ([1, 0], [1, 7]), (
        f"one real draft each (num_drafts = 1, -1 padding after it): got {num.tolist()} accepted "
        f"and next tokens {nxt.tolist()}, expected [1, 0] and [1, 7], the target's choice right "
        "after the last real draft"
    )


def bonus_setting(deterministic: bool, rows: int):
    """Every draft certain to be kept (p = 1 at each draft), and a target row after them that is a coin toss
    between tokens 0 and 1, while the drafter's last q leans to token 0: the bonus token must follow p."""
    vocab, k = 6, 2
    drafts = torch.tensor([[4, 0]]).expand(rows, k)
    p = torch.zeros(rows, k + 1, vocab)
    p[:, 0, 4] = p[:, 1, 0] = 1.0
    p[:, 2, :2] = 0.5
    q = None
    if not deterministic:
        q = torch.zeros(rows, k, vocab)
        q[:, 0, 4] = 1.0
        q[:, 1, 0], q[:, 1, 1] = 0.9, 0.1
    return drafts, p, q


@pytest.mark.lab4
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-drafts", "deterministic-drafts"])
def test_the_token_after_the_last_kept_draft_comes_from_p(load, deterministic):
    rejection = load("speculative.rejection")
    rows = 2000
    drafts, p, q = bonus_setting(deterministic, rows)
    num, nxt = rejection.verify(drafts, p, q, generators=torch.Generator().manual_seed(0))
    assert num.tolist() == [2] * rows, "drafts with p(x) = 1 must always be kept"
    share = float((nxt == 0).float().mean())
    assert 0.4 < share < 0.6, (
        f"after both drafts were kept, the bonus token was 0 in {share:.0%} of {rows} rows, where p gives it "
        "50%: nothing was rejected there, so draw it from p itself, not from the residual max(0, p - q)"
    )


@pytest.mark.lab4
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-drafts", "deterministic-drafts"])
def test_padding_past_num_drafts_is_never_accepted(load, deterministic):
    """Request 0 drafted one token, request 1 none; their rows are padded with token 0, which the target would
    accept everywhere (p = 1 at token 0), so only the num_drafts mask keeps the padding out."""
    rejection = load("speculative.rejection")
    vocab, k = 5, 3
    drafts = torch.tensor([[2, 0, 0], [0, 0, 0]])
    p = torch.zeros(2, k + 1, vocab)
    p[:, :, 0] = 1.0
    p[0, 0] = torch.nn.functional.one_hot(torch.tensor(2), vocab).float()
    q = None if deterministic else torch.nn.functional.one_hot(drafts, vocab).float()
    num, nxt = rejection.verify(drafts, p, q, num_drafts=torch.tensor([1, 0]))
    assert num.tolist() == [1, 0], (
        f"accepted {num.tolist()} drafts for requests that drafted [1, 0] (num_drafts): positions at or past "
        "num_drafts[b] are padding; mask them out of the accepted run"
    )
    assert nxt.tolist() == [0, 0], (
        f"next tokens {nxt.tolist()}: the target's choice after the last real draft"
    )


@pytest.mark.lab4
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-drafts", "deterministic-drafts"])
def test_a_request_that_drafted_fewer_keeps_its_bonus_token_from_p(load, deterministic):
    """A batch of chains of different lengths, as the engine verifies them (one request near its context
    limit drafts fewer): request 0 drafted 1 of K = 3 and the target keeps it, request 1 drafted none. Neither
    was rejected, so the token after their last draft comes from p itself: half 0, half 1."""
    rejection = load("speculative.rejection")
    rows, vocab, k = 400, 4, 3
    drafts = torch.tensor([[2, -1, -1], [-1, -1, -1]]).repeat(rows // 2, 1)  # -1: padding past num_drafts
    p = torch.zeros(rows, k + 1, vocab)
    p[:, :, :2] = 0.5
    p[0::2, 0] = torch.nn.functional.one_hot(torch.tensor(2), vocab).float()  # request 0's draft is kept
    q = None if deterministic else torch.nn.functional.one_hot(drafts.clamp(min=0), vocab).float()
    num_drafts = torch.tensor([1, 0]).repeat(rows // 2)
    num, nxt = rejection.verify(drafts, p, q, num_drafts, generators=torch.Generator().manual_seed(1))
    assert num.tolist() == [1, 0] * (rows // 2), "request 0 keeps its one draft, request 1 has none"
    for request in (0, 1):
        share = float((nxt[request::2] == 0).float().mean())
        assert 0.35 < share < 0.65, (
            f"request {request} (num_drafts {[1, 0][request]} of K = {k}, nothing rejected) drew token 0 "
            f"as its next token in {share:.0%} of {rows // 2} rows, where p gives it 50%. Likely: 'rejected' "
            "compared with K instead of num_drafts[b], so a request that drafted fewer than K looked "
            "rejected and drew from max(0, p - q) of a padding position"
        )


@pytest.mark.lab4
def test_tree_attention_mask_is_boolean(load):
    """The engine's tree attention joins the mask to the context's visible columns and inverts it (~mask) to
    build SDPA's additive mask: it must be a bool tensor, not 0/1 numbers."""
    mask = load("speculative.tree").tree_attention_mask([-1, 0, 0, 1])
    assert mask.dtype == torch.bool, (
        f"tree_attention_mask returned {mask.dtype}: return a bool tensor "
        "(torch.zeros(n, n, dtype=torch.bool)); a float mask compares equal to the right True/False, but "
        "the engine's ~mask fails on it"
    )


@pytest.mark.lab4
def test_tree_attention_mask_matches_a_hand_built_tree(load):
    tree = load("speculative.tree")
    #      root(0) ─ a(1) ─ c(3)
    #             │      └ d(4) ─ e(5)
    #             └ b(2)
    parents = [-1, 0, 0, 1, 1, 4]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 1, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    mask = tree.tree_attention_mask(parents)
    assert mask.shape == expected.shape and mask.dtype == torch.bool, (
        f"the mask must be bool [N, N] = [6, 6], got {mask.dtype} {tuple(mask.shape)}"
    )
    for node in range(len(parents)):
        sees, should = mask[node].nonzero().flatten().tolist(), expected[node].nonzero().flatten().tolist()
        assert sees == should, (
            f"node {node} (parent {parents[node]}) sees nodes {sees}, expected {should}: a node sees itself "
            "and everything its parent sees (all its ancestors, back to the root), and nothing else"
        )
    assert tree.tree_positions(parents, 10).tolist() == [10, 11, 11, 12, 12, 13]


def test_tree_walk_follows_the_target_and_is_exact(load):
    tree_mod = load("speculative.tree")
    tree = tree_mod.DraftTree(token_ids=[9, 1, 2, 3, 4, 5], parents=[-1, 0, 0, 1, 1, 4], log_probs=[0.0] * 6)
    greedy = torch.zeros(6, 8)
    for node, best in enumerate(
        [1, 4, 0, 0, 5, 6]
    ):  # root -> 1 (node a), a -> 4 (node d), d -> 5 (node e), e -> 6
        greedy[node, best] = 1.0
    assert tree_mod.walk_tree(tree, greedy) == ([1, 4, 5], 6)
    assert tree_mod.walk_greedy(tree, greedy.argmax(-1).tolist()) == ([1, 4, 5], 6)
    greedy[1] = 0
    greedy[1, 7] = 1.0  # the target wants 7 after a: no child holds it
    assert tree_mod.walk_tree(tree, greedy) == ([1], 7)
    assert tree_mod.walk_greedy(tree, greedy.argmax(-1).tolist()) == ([1], 7)
    # Sampling: the first emitted token follows the target's p at the root, whichever children were drafted.
    p_root = torch.tensor([0.1, 0.3, 0.25, 0.0, 0.15, 0.0, 0.2, 0.0])
    probs = torch.full((6, 8), 1 / 8)
    probs[0] = p_root
    gen = torch.Generator().manual_seed(0)
    firsts = []
    for _ in range(4000):
        path, token = tree_mod.walk_tree(tree, probs, gen)
        firsts.append(tree.token_ids[path[0]] if path else token)
    observed = torch.bincount(torch.tensor(firsts), minlength=8).double()
    assert observed[p_root == 0].sum() == 0
    assert chi_square_p_value(observed, p_root.double() * 4000) > 1e-3


def test_grow_tree_keeps_the_most_probable_nodes_parent_first(load):
    tree_mod = load("speculative.tree")
    gen = torch.Generator().manual_seed(0)
    table = torch.log_softmax(
        torch.randn(16, 16, generator=gen) * 2, -1
    )  # a toy draft: next token given token
    calls = []

    def expand(frontier, tokens, parents):
        calls.append(len(frontier))
        return table[torch.tensor([tokens[j] for j in frontier])]

    tree = tree_mod.grow_tree(3, table[3], expand, depth=4, top_k=3, num_nodes=10)
    assert len(tree) == 11 and calls == [3, 3, 3]
    assert all(0 <= p < i for i, p in enumerate(tree.parents[1:], 1))
    for i in range(1, len(tree)):  # cumulative scores are the sums of the toy draft's log-probabilities
        parent = tree.parents[i]
        assert math.isclose(
            tree.log_probs[i],
            tree.log_probs[parent] + float(table[tree.token_ids[parent], tree.token_ids[i]]),
            abs_tol=1e-5,
        )
    assert min(tree.log_probs[1:]) >= sorted(tree.log_probs[1:])[0]
    with pytest.raises(ValueError, match="depth, top_k and num_nodes"):
        tree_mod.grow_tree(3, table[3], expand, depth=0, top_k=3, num_nodes=10)


def test_ngram_lookup_copies_what_followed_the_latest_match(load):
    propose = load("speculative.ngram").propose_ngram
    assert propose([5, 6, 7, 8, 9, 5, 6, 7], 3) == [8, 9, 5]
    assert propose([1, 2, 3, 1, 2, 4, 1, 2], 2) == [4, 1]  # the most recent match wins
    assert propose([1, 2, 3, 4], 2) == []
    assert propose([7, 7, 7], 4) == [7]  # overlapping match: only what is already known can be copied
    with pytest.raises(ValueError, match="num_tokens"):
        propose([1, 2], 0)
    with pytest.raises(ValueError, match="min_ngram"):
        propose([1, 2], 2, max_ngram=1, min_ngram=2)


def scan_ngram(token_ids: list[int], num_tokens: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Prompt lookup written as the plain right-to-left scan: the oracle for ``propose_ngram``."""
    length = len(token_ids)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        for start in range(length - n - 1, -1, -1):
            if token_ids[start : start + n] == token_ids[length - n :]:
                return token_ids[start + n : start + n + num_tokens]
    return []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=40),
    st.integers(1, 6),
    st.integers(1, 4).flatmap(lambda hi: st.tuples(st.integers(1, hi), st.just(hi))),
)
def test_ngram_lookup_equals_the_plain_scan(token_ids, num_tokens, ngram_range):
    from solutions.speculative.ngram import propose_ngram

    min_ngram, max_ngram = ngram_range
    expected = scan_ngram(token_ids, num_tokens, max_ngram, min_ngram)
    assert propose_ngram(token_ids, num_tokens, max_ngram, min_ngram) == expected


def tiny_llama(load, seed: int = 0):
    """A random 2-layer Llama with a 64-token vocabulary (float32, CPU)."""
    config_mod, llama = load("model.config"), load("model.llama")
    config = config_mod.ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = llama.LlamaModel(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    model.rope_cos, model.rope_sin = llama.rope_tables(8, 10000.0, 256)
    return model.eval().requires_grad_(False)


def plain_greedy(model, prompt, max_tokens):
    """The oracle: recompute the whole sequence (no cache) and take the argmax, one token at a time."""
    ids = list(prompt)
    for _ in range(max_tokens):
        ids.append(int(model.sequence_logits(torch.tensor(ids))[-1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("method", ["ngram", "eagle-chain", "eagle-tree"])
def test_greedy_speculative_decoding_equals_plain_greedy(load, method):
    loop, drafter, eagle = load("speculative.loop"), load("speculative.drafter"), load("speculative.eagle")
    model = tiny_llama(load)
    torch.manual_seed(1)
    head = eagle.EagleHead(model.config, torch.randperm(64)[:40]).attach(model)
    accepted = 0
    for prompt in [[1, 2, 3, 4, 1, 2, 3], [9, 8, 7], [5] * 6, list(range(20, 40))]:
        if method == "ngram":
            d, nodes = drafter.NgramDrafter(4), 0
        else:
            d, nodes = (
                drafter.EagleDrafter(head, 3, tree_depth=3, tree_top_k=3),
                (6 if method == "eagle-tree" else 0),
            )
        result = loop.speculative_generate(model, d, prompt, 20, tree_nodes=nodes)
        assert result.token_ids == plain_greedy(model, prompt, 20), (method, prompt)
        assert (
            1 + sum(result.per_pass) >= 20 and min(result.per_pass) >= 1
        )  # the prefill gave the first token
        accepted += sum(result.per_pass) - len(result.per_pass)
    print(method, "drafts accepted:", accepted)


def test_draft_kv_tree_mask_matches_separate_chains(load):
    """Drafting two branches at once under a tree mask gives the same head outputs as drafting each alone."""
    eagle = load("speculative.eagle")
    model = tiny_llama(load)
    head = eagle.EagleHead(model.config, torch.arange(64)).attach(model)
    feats = torch.randn(5, 32)
    ids = torch.tensor([3, 4, 5, 6, 7])
    both = eagle.DraftKV()
    head(feats[:3], ids[:3], torch.arange(3), both.attend(["s"], [3]))
    visible = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]], dtype=torch.bool)  # two siblings at position 3
    out = head(feats[3:], ids[3:], torch.tensor([3, 3]), both.attend(["s"], [2], [visible]))
    for row in range(2):
        alone = eagle.DraftKV()
        head(feats[:3], ids[:3], torch.arange(3), alone.attend(["s"], [3]))
        single = head(
            feats[3 + row : 4 + row], ids[3 + row : 4 + row], torch.tensor([3]), alone.attend(["s"], [1])
        )
        torch.testing.assert_close(out[row : row + 1], single)


def test_bad_spec_options_fail_clearly(load, tmp_path):
    eagle = load("speculative.eagle")
    model = tiny_llama(load)
    head = eagle.EagleHead(model.config, torch.arange(40)).attach(model)
    with pytest.raises(ValueError, match="draft vocabulary size"):
        head.use_vocab(0)
    with pytest.raises(ValueError, match="does not fit the model"):
        eagle.EagleHead(model.config, torch.tensor([70])).attach(model)
    path = tmp_path / "head.safetensors"
    eagle.save_head(head, path, {"seed": "0"})
    other = tiny_llama(load)
    other.config = type(model.config)(
        **{**model.config.__dict__, "hidden_size": 64, "num_heads": 8, "head_dim": 8}
    )
    with pytest.raises(ValueError, match="does not fit the model"):
        eagle.load_head(other, path)
    with pytest.raises(FileNotFoundError, match="train one"):
        eagle.load_head(model, tmp_path / "missing.safetensors")
    loaded = eagle.load_head(model, path)
    torch.testing.assert_close(loaded.fc.weight, head.fc.weight.half().float())


def test_lab4_exercises_are_holes_in_labs():
    rejection = importlib.import_module("labs.speculative.rejection")
    tree = importlib.import_module("labs.speculative.tree")
    with pytest.raises(NotImplementedError, match="Lab 4"):
        rejection.verify(torch.zeros(1, 1, dtype=torch.long), torch.full((1, 2, 4), 0.25))
    with pytest.raises(NotImplementedError, match="Lab 4"):
        tree.tree_attention_mask([-1, 0])


def test_training_prompts_are_the_tools_and_never_held_back():
    """``data/spec/prompts_templated.jsonl`` is what ``tools/make_spec_prompts.py`` writes, and no training
    prompt is a held-back one (``bench spec`` and the notebook measure acceptance on those)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    check = subprocess.run(
        [sys.executable, "tools/make_spec_prompts.py", "--check"], cwd=root, capture_output=True
    )
    assert check.returncode == 0, check.stdout.decode()
    spec = root / "data" / "spec"
    read = lambda name: [
        json.loads(line)["prompt"] for line in (spec / name).read_text().splitlines() if line
    ]
    train = read("prompts.jsonl") + read("prompts_templated.jsonl")
    assert len(train) == len(set(train)), "a training prompt appears twice"
    assert not set(train) & set(read("heldout.jsonl")), "a held-back prompt is in the training set"


class _ScriptedDrafter:
    """Drafts from a script that knows the answer: a chain of ``right`` true tokens then a wrong one,
    or a tree whose true path hangs under a wrong sibling at each of ``right`` depths. Checks the
    features it is handed."""

    def __init__(self, load, answer: list[int], right: int):
        self.tree_mod, self.answer, self.right = load("speculative.tree"), answer, right
        self.known = 0

    def observe(self, request_id, features, first_position):
        assert first_position == self.known and features.shape[0] >= 1, (
            "features arrive in order, none skipped"
        )
        self.known += features.shape[0]

    def _upcoming(self, token_ids):
        assert self.known == len(token_ids) - 1, "the drafter holds every feature before the newest token"
        return self.answer[len(token_ids) : len(token_ids) + self.right]

    def propose(self, request_ids, token_ids, limits, temperatures):
        return [_Draft(self._upcoming(token_ids[0]) + [-1])]

    def propose_tree(self, request_id, token_ids, num_nodes):
        tokens, parents = [token_ids[-1]], [-1]
        for token in self._upcoming(token_ids):
            parent = len(tokens) - 1  # the root, then the true token added last
            tokens += [-1, token]  # a wrong sibling first, then the true token
            parents += [parent, parent]
        return self.tree_mod.DraftTree(tokens, parents, [0.0] * len(tokens))

    def free(self, request_id):
        self.known = 0


class _Draft:
    def __init__(self, token_ids):
        self.token_ids = token_ids


@pytest.mark.parametrize("tree_nodes", [0, 8])
def test_teacher_forced_acceptance_counts_the_matching_path(load, tree_nodes):
    acceptance = load("speculative.acceptance")
    answer, prompt_len = list(range(100, 112)), 4
    features = torch.zeros(len(answer), 3)
    drafter = _ScriptedDrafter(load, answer, right=2)
    result = acceptance.teacher_forced_acceptance(drafter, [(answer, prompt_len, features)], tree_nodes)
    # Positions 4..10 draft below the newest token; near the end fewer true tokens remain to match.
    assert result.accepted == [2, 2, 2, 2, 2, 2, 1]
    assert result.tau == pytest.approx(1 + 13 / 7) and result.at_least(2) == pytest.approx(6 / 7)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--samples", "-1"], "--samples must be >= 0"),
        (["--data-fraction", "0"], "--data-fraction must be in"),
        (["--data-fraction", "1.5"], "--data-fraction must be in"),
        (["--vocab-size", "9000"], "--vocab-size must not exceed --keep-vocab"),
        (["--add-samples", "2"], "--add-samples needs --reuse-responses"),
    ],
)
def test_train_eagle_rejects_bad_options_by_name(argv, message, capsys):
    from solutions.cli import train_eagle

    with pytest.raises(SystemExit):
        train_eagle.main(argv)
    assert message in capsys.readouterr().err


def test_tree_choice_weighs_acceptance_against_drafting_and_verify_cost(load):
    """S = tau / (draft_ms / step_ms + verify_ratio(rows)): a bigger tree wins only when its extra tau pays
    for its longer verify pass; the interpolated verify ratio runs through the measured points."""
    choice = load("speculative.tree_choice")
    ratio = choice.interpolate({1: 1.0, 2: 1.1, 8: 1.7})
    assert [round(ratio(r), 6) for r in (1, 2, 5, 8, 14)] == [1.0, 1.1, 1.4, 1.7, 2.3]
    chain = choice.TreeOption("chain 3", 3, 1, 0, tau=2.0, draft_ms=3.0)  # 4 rows: ratio 1.3
    tree = choice.TreeOption("tree 7", 4, 4, 7, tau=2.4, draft_ms=6.0)  # 8 rows: ratio 1.7
    assert choice.predicted_speedup(chain, 30.0, ratio) == pytest.approx(2.0 / (0.1 + 1.3))
    best, ranked = choice.choose_tree([tree, chain], 30.0, ratio)
    assert best is chain and [o.name for o, _ in ranked] == ["chain 3", "tree 7"]
    cheap_rows = choice.interpolate({1: 1.0, 8: 1.05})  # verifying 8 rows at nearly one row's price
    assert choice.choose_tree([tree, chain], 30.0, cheap_rows)[0] is tree
    with pytest.raises(ValueError, match="ratio at 1 row"):
        choice.interpolate({2: 1.1, 8: 1.7})
