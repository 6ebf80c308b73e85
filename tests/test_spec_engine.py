"""Speculative decoding inside the engine (Lesson 4), on the bundled model.

Greedy speculative decoding must reproduce plain greedy decoding token for token, batched and alone, for
n-gram drafts, EAGLE chains and EAGLE trees; after rejected drafts the paged KV must hold exactly what a
fresh prefill would compute.
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a year is a leap year.",
    "Why do cats purr?",
    "Write a short poem about the moon.",
    "Repeat after me three times: the quick brown fox jumps over the lazy dog.",
]
METHODS = {
    "ngram": dict(speculative="ngram", num_speculative_tokens=3),
    "eagle-chain": dict(speculative="eagle", num_speculative_tokens=4),
    "eagle-tree": dict(speculative="eagle", num_speculative_tokens=4, speculative_tree_nodes=10),
    "eagle-chain-graphs": dict(speculative="eagle", num_speculative_tokens=4),
}
# Methods run as on a GPU: decode graphs captured (recorded: ``RecordedCall``), so decode steps and the
# steps verifying chains replay them, and the drafter reads the target's features from the graph's output.
GRAPHED = {"eagle-chain-graphs"}
ENGINE = dict(device="cpu", dtype="float32", max_num_seqs=4, max_model_len=512, kv_cache_memory=48 << 20)


@pytest.fixture(scope="module")
def chats(llm):
    return [llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain_outputs(load, chats):
    plain = load("llm").LLM(**ENGINE)
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=40)
    return [o.outputs[0].token_ids for o in plain.generate(chats, params)]


@pytest.fixture(scope="module", params=list(METHODS))
def spec_llm(request, load):
    llm = load("llm").LLM(**ENGINE, **METHODS[request.param])
    if request.param in GRAPHED:
        runner, recorded = llm.engine.runner, load("engine.cuda_graphs").RecordedCall
        runner.capture_decode_graphs(llm.engine.config.max_graph_rows, recorded)
        replay, llm.replayed = runner.graphs.replay, []
        runner.graphs.replay = lambda bucket: llm.replayed.append(bucket) or replay(bucket)
    return request.param, llm


def test_greedy_speculative_equals_plain_greedy(load, spec_llm, chats, plain_outputs):
    method, llm = spec_llm
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=40)
    batched = llm.generate(chats, params)
    assert [o.outputs[0].token_ids for o in batched] == plain_outputs, f"{method}, batched"
    if method in GRAPHED:  # 4 requests, each verifying up to 4 drafts: buckets above 4 held drafts
        assert max(llm.replayed) > len(chats), f"{method}: no step verifying drafts replayed a graph"
    for chat, want in zip(chats[:2], plain_outputs[:2]):
        assert llm.generate(chat, params)[0].outputs[0].token_ids == want, f"{method}, alone"
    taus = [o.metrics.mean_acceptance_length for o in batched]
    assert all(t is not None and t >= 1 for t in taus)
    assert max(taus) > 1.0, f"{method} accepted no draft at all: {taus}"
    assert llm.engine.kv.num_used_blocks == 0  # every block came back


def test_paged_kv_is_consistent_after_rejections(load, spec_llm, chats):
    """Run speculatively until drafts were rejected, then one plain step:
    its logits equal a fresh prefill's."""
    method, llm = spec_llm
    engine = llm.engine
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=64)
    request_id = engine.add_request(chats[0], params)
    request = engine.groups[request_id].requests[0]
    speculator = engine.speculator
    while len(request.output_token_ids) < 24 and not request.finished:
        engine.step()
    metrics = request.group.metrics
    assert (
        0
        < metrics.num_verified_tokens
        < metrics.num_verify_passes * (1 + engine.config.num_speculative_tokens)
    )
    captured = {}
    execute = engine.runner.execute

    def capture(plan, **kwargs):
        out = execute(plan, **kwargs)
        captured["logits"] = out.logits[out.logits_spans[request_id]][-1]
        return out

    engine.speculator, engine.runner.execute = None, capture
    try:
        ids = request.all_token_ids
        engine.step()
    finally:
        engine.speculator, engine.runner.execute = speculator, execute
        engine.abort(request_id)
    fresh = engine.model.sequence_logits(torch.tensor(ids))[-1]
    torch.testing.assert_close(captured["logits"], fresh, rtol=1e-4, atol=1e-3)


def test_sampling_with_drafts_gives_valid_tokens(load, spec_llm, chats):
    """Temperature > 0 goes through rejection sampling
    (its exactness: tests/test_spec.py's chi-square tests)."""
    method, llm = spec_llm
    params = load("sampling_params").SamplingParams(temperature=0.8, top_k=50, max_tokens=24, seed=3)
    out = llm.generate(chats[1:3], params)
    for o in out:
        ids = o.outputs[0].token_ids
        assert len(ids) == 24 or o.outputs[0].finish_reason == "stop"
        assert all(0 <= t < llm.engine.model_config.vocab_size for t in ids)
        assert o.metrics.mean_acceptance_length is None or o.metrics.mean_acceptance_length >= 1


def test_shipped_head_loads_and_matches_its_checksum(load, llm):
    eagle = load("speculative.eagle")
    manifest = json.loads((eagle.SPEC_DIR / "eagle_head.json").read_text())
    assert eagle.sha256_of(eagle.HEAD_PATH) == manifest["sha256"]
    head = eagle.load_head(llm.engine.model)
    assert len(head.vocab_ids) == int(manifest["draft_vocab_size"])
    assert head.fc.weight.dtype == torch.float32 and head.fc.weight.shape == (576, 1152)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(speculative="lookahead"), "speculative must be None or one of"),
        (
            dict(speculative="ngram", num_speculative_tokens=0),
            "num_speculative_tokens must be an integer >= 1",
        ),
        (dict(speculative="ngram", speculative_tree_nodes=8), "draft trees need speculative='eagle'"),
        (dict(speculative="eagle", speculative_tree_nodes=-1), "speculative_tree_nodes must be >= 0"),
        (
            dict(speculative="ngram", speculative_disable_by_batch_size=-1),
            "speculative_disable_by_batch_size must be an integer >= 0",
        ),
    ],
)
def test_bad_speculative_options_fail_clearly(load, options, message):
    with pytest.raises(ValueError, match=message):
        load("config").EngineConfig(device="cpu", **options)


def test_speculation_stops_above_the_batch_size_it_is_disabled_by(load, chats, plain_outputs):
    """``speculative_disable_by_batch_size=2``: four requests running together verify no draft (the output
    stays plain greedy's), and a lone request speculates again on the same engine, its drafter having seen
    every feature of the steps it did not draft in."""
    llm = load("llm").LLM(**ENGINE, **METHODS["eagle-chain"], speculative_disable_by_batch_size=2)
    # EOS ignored, so that all four run to the end together; greedy tokens up to plain's EOS are the same.
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    batched = llm.generate(chats, params)
    for out, want in zip(batched, plain_outputs):
        assert out.outputs[0].token_ids[: len(want)] == want[:24]
    assert [o.metrics.num_verify_passes for o in batched] == [0] * len(chats), "a step of 4 drafted"
    alone = llm.generate(chats[0], params)[0]
    assert alone.outputs[0].token_ids[: len(plain_outputs[0])] == plain_outputs[0][:24]
    assert alone.metrics.num_verify_passes > 0, "a lone request drafted nothing"


def test_a_head_that_does_not_fit_fails_clearly(load, tmp_path):
    config_mod, eagle = load("model.config"), load("speculative.eagle")
    small = config_mod.ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2,
        head_dim=8, rope_theta=1e4, rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    path = tmp_path / "small_head.safetensors"
    eagle.save_head(eagle.EagleHead(small, torch.arange(10)), path, {})
    with pytest.raises(ValueError, match="does not fit the model"):
        load("llm").LLM(**ENGINE, speculative="eagle", eagle_head=str(path))


def test_eagle_drafts_for_an_awq_target(load, chats, monkeypatch):
    """A quantized target keeps its LM head packed: the head reads it dequantized, and greedy output is still
    the plain (AWQ) engine's, token for token, in batch-invariant mode. Outside it a verify pass's rows round
    differently from a lone decode's, and an INT4 model's near-ties flip (the recalibrated scales of
    2026-12-07 diverged at token 15 of the first prompt); ``kernels/batch_invariant.py`` is the guarantee."""
    monkeypatch.setenv("FASTMODE_BATCH_INVARIANT", "1")
    LLM = load("llm").LLM
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=24)
    awq = dict(ENGINE, quantization="awq")
    plain = [o.outputs[0].token_ids for o in LLM(**awq).generate(chats[:2], params)]
    spec = LLM(**awq, **METHODS["eagle-tree"]).generate(chats[:2], params)
    assert [o.outputs[0].token_ids for o in spec] == plain
    assert max(o.metrics.mean_acceptance_length for o in spec) > 1.0, (
        "the head accepted no draft on the AWQ target"
    )


def test_a_loaded_head_runs_the_targets_layer_ops(load, llm):
    """The head's decoder layer runs the chains the engine chose for the target (fused where they pay: on CUDA
    the Triton kernels, some 20 fewer launches a draft pass than the plain chains)."""
    head = load("speculative.eagle").load_head(llm.engine.model)
    layer = head.layer
    modules = (layer.input_layernorm, layer.post_attention_layernorm, layer.self_attn, layer.mlp)
    assert all(module.ops is llm.engine.model.ops for module in modules)


def test_a_loaded_head_drafts_through_the_fastest_cpu_product(load, llm):
    """On a CPU the draft's vocabulary projection runs the measured-fastest path,
    and gives the plain product's logits."""
    head = load("speculative.eagle").load_head(llm.engine.model)
    assert head.vocab_linear is not None and head.vocab_linear.weight.shape == head.vocab_rows.shape
    hidden = torch.randn(4, head.vocab_rows.shape[1])
    torch.testing.assert_close(head.draft_logits(hidden), hidden @ head.vocab_rows.T, rtol=1e-4, atol=1e-4)
    head.use_vocab(1024)  # another vocabulary: the projection follows it
    assert head.draft_logits(hidden).shape == (4, 1024)


def test_logprobs_with_tree_drafts_equal_plain_decodings(load, chats):
    """A tree's accepted path is not a run of consecutive rows: each token's entry must come from the row of
    the node before it (the root's, then each accepted node's). Greedy EAGLE trees give plain decoding's
    tokens, and each token's log-probability, rank and top 3 as plain decoding gives them (1e-4)."""
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=24, logprobs=3)
    plain = load("llm").LLM(**ENGINE).generate(chats[:2], params)
    tree = load("llm").LLM(**ENGINE, **METHODS["eagle-tree"]).generate(chats[:2], params)
    for want, got in zip(plain, tree, strict=True):
        assert got.metrics.mean_acceptance_length > 1, "no draft was accepted: the test proves less"
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        assert len(got.outputs[0].logprobs) == len(want.outputs[0].token_ids)
        for i, (expected, entry) in enumerate(zip(want.outputs[0].logprobs, got.outputs[0].logprobs)):
            assert entry.keys() == expected.keys(), f"token {i}: the top 3 differ from plain decoding's"
            for token, lp in entry.items():
                assert abs(lp.logprob - expected[token].logprob) < 1e-4 and lp.rank == expected[token].rank, (
                    f"token {i}: {token}'s entry {lp} against plain decoding's {expected[token]}"
                )
