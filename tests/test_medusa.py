"""Medusa heads (Lesson 4): their drafts, their trees, and greedy output identical to plain decoding.

The heads' drafts come from the target's newest feature alone: head ``k`` drafts the token ``k`` places after
the root, and a tree hangs head ``d``'s top-k at depth ``d``. Greedy decoding with them must reproduce plain
greedy decoding token for token on held-back prompts (chains and trees, batched); sampling goes through the
same exact rejection sampling as every drafter (its exactness: tests/test_spec.py).
"""

from __future__ import annotations

import json

import pytest
import torch

ENGINE = dict(device="cpu", dtype="float32", max_num_seqs=4, max_model_len=512, kv_cache_memory=48 << 20)
METHODS = {
    "medusa-chain": dict(speculative="medusa", num_speculative_tokens=3),
    "medusa-tree": dict(speculative="medusa", num_speculative_tokens=4, speculative_tree_nodes=10),
}


@pytest.fixture(scope="module")
def heads(load, llm):
    return load("speculative.medusa").load_heads(llm.engine.model)


def test_shipped_heads_load_and_match_their_checksum(load, heads):
    medusa, eagle = load("speculative.medusa"), load("speculative.eagle")
    manifest = json.loads(medusa.MEDUSA_PATH.with_suffix(".json").read_text())
    assert eagle.sha256_of(medusa.MEDUSA_PATH) == manifest["sha256"]
    assert heads.num_heads == int(manifest["settings"]["num_heads"])
    assert len(heads.vocab_ids) == int(manifest["draft_vocab_size"])
    assert medusa.MEDUSA_PATH.stat().st_size < 8 << 20  # float16, a few MB


def test_untrained_heads_repeat_the_lm_heads_guess(load, llm):
    """W_k = 0: every head's hidden state is SiLU(0) + f = f, so it drafts what the LM head predicts."""
    medusa, model = load("speculative.medusa"), llm.engine.model
    heads = medusa.MedusaHeads(model.config, 3, torch.arange(model.config.vocab_size)).attach(model)
    features = torch.randn(5, model.config.hidden_size)
    logits = heads.draft_logits(heads(features))
    assert logits.shape == (5, 3, model.config.vocab_size)
    want = features @ model.lm_head.weight.T
    for k in range(3):
        torch.testing.assert_close(logits[:, k], want, rtol=1e-5, atol=1e-4)


def test_drafts_come_from_the_newest_feature_in_one_product(load, heads):
    """A chain is each head's argmax; a tree holds head d's top-k at depth d under each kept parent."""
    medusa = load("speculative.medusa")
    feature = torch.randn(heads.config.hidden_size)
    logits = heads.draft_logits(heads(feature[None]))[0]  # [K, Vd]
    drafter = medusa.MedusaDrafter(heads, 3, tree_depth=3, tree_top_k=3)
    drafter.observe("r", torch.stack([torch.zeros_like(feature), feature]), 4)  # positions 4, 5
    ids = list(range(7))  # 6 computed tokens, the newest (the root) awaits its pass
    chain = drafter.propose(["r"], [ids], [10], [0.0])[0]
    assert chain.token_ids == heads.vocab_ids[logits[:3].argmax(-1)].tolist() and chain.probs is None
    tree = drafter.propose_tree("r", ids, 8)
    assert len(tree) == 9 and tree.token_ids[0] == ids[-1]
    for node, depth in enumerate(tree.depths()[1:], 1):
        top = heads.vocab_ids[logits[depth - 1].topk(3).indices].tolist()
        assert tree.token_ids[node] in top, f"node {node} at depth {depth}"
    sampled = drafter.propose(["r"], [ids], [2], [0.7])[0]
    assert len(sampled.token_ids) == 2 and sampled.probs.shape == (2, heads.lm_head_weight.shape[0])
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(2))
    assert all(sampled.probs[i, t] > 0 for i, t in enumerate(sampled.token_ids))


def test_the_drafter_refuses_a_stale_feature_and_too_deep_drafts(load, heads):
    medusa = load("speculative.medusa")
    drafter = medusa.MedusaDrafter(heads, 2)
    drafter.observe("r", torch.zeros(3, heads.config.hidden_size), 0)  # positions 0..2
    assert drafter.ready("r", 3) and not drafter.ready("r", 4)
    with pytest.raises(RuntimeError, match="holds the feature of position 2"):
        drafter.propose(["r"], [list(range(6))], [4], [0.0])
    with pytest.raises(ValueError, match="draft at most"):
        medusa.MedusaDrafter(heads, heads.num_heads + 1)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_medusa_equals_plain_greedy_on_heldout_prompts(load, llm, method):
    spec_dir = load("speculative.eagle").SPEC_DIR
    rows = [json.loads(line) for line in (spec_dir / "heldout.jsonl").read_text().splitlines()]
    chats = [llm.tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}]) for r in rows[::4]]
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=32)
    plain = [o.outputs[0].token_ids for o in llm.generate(chats, params)]
    spec = load("llm").LLM(**ENGINE, **METHODS[method])
    out = spec.generate(chats, params)
    assert [o.outputs[0].token_ids for o in out] == plain
    taus = [o.metrics.mean_acceptance_length for o in out]
    assert max(taus) > 1.0, f"{method} accepted no draft: {taus}"
    sampled = load("sampling_params").SamplingParams(temperature=0.8, top_k=50, max_tokens=16, seed=1)
    for o in spec.generate(chats[:2], sampled):
        assert all(0 <= t < spec.engine.model_config.vocab_size for t in o.outputs[0].token_ids)
    assert spec.engine.kv.num_used_blocks == 0


def test_medusa_options_fail_clearly(load, tmp_path):
    with pytest.raises(FileNotFoundError, match="train-medusa"):
        load("llm").LLM(**ENGINE, speculative="medusa", medusa_heads=str(tmp_path / "none.safetensors"))
