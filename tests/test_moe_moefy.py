"""Lesson 5, MoEfication: balanced neuron split, router training, k = E equivalence, the converted folder."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import write_tiny_llama


def test_balanced_assign_gives_every_cluster_the_same_size(load):
    split = load("moe.split")
    similarity = torch.zeros(6, 3)
    similarity[:, 0] = 1.0  # every item prefers cluster 0; only two may have it
    labels = split.balanced_assign(similarity, size=2)
    assert sorted(labels.tolist()) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="do not split"):
        split.balanced_assign(torch.zeros(7, 3), size=2)


def test_balanced_kmeans_recovers_planted_co_activation_groups(load):
    split = load("moe.split")
    g = torch.Generator().manual_seed(0)
    groups, per_group, tokens = 4, 12, 300
    # each group of neurons fires on its own random quarter of the tokens
    fires = torch.rand(groups, tokens, generator=g) < 0.25
    truth = torch.arange(groups).repeat_interleave(per_group)[torch.randperm(groups * per_group, generator=g)]
    features = fires[truth].float() * (1 + torch.rand(groups * per_group, tokens, generator=g))
    labels = split.balanced_kmeans(features, groups, seed=1)
    assert torch.bincount(labels).tolist() == [per_group] * groups
    for c in range(groups):  # each found cluster is exactly one planted group
        assert len(set(truth[labels == c].tolist())) == 1
    neurons = split.neurons_by_expert(labels, groups)
    assert neurons.shape == (groups, per_group) and sorted(neurons.flatten().tolist()) == list(range(48))


def test_router_learns_which_experts_matter(load):
    split = load("moe.split")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 16, generator=g)
    true_router = torch.randn(6, 16, generator=g)
    importance = torch.softmax(x @ true_router.t(), dim=1)  # a planted, linearly predictable importance
    router = split.train_router(x[:1800], importance[:1800], steps=300)
    assert split.top_k_recall(x[1800:] @ router.t(), importance[1800:], 2) > 0.9
    assert split.top_k_recall(torch.randn(200, 6, generator=g), importance[1800:], 2) < 0.6  # chance is 1/3


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random Llama written by transformers (no tokenizer),
    and a random split of its FFNs into 4 experts."""
    folder = write_tiny_llama(
        tmp_path_factory.mktemp("llama"), hidden_size=48, intermediate_size=96, max_position_embeddings=128
    )
    g = torch.Generator().manual_seed(1)
    neurons = torch.stack([torch.randperm(96, generator=g).view(4, 24).sort(dim=1).values for _ in range(2)])
    routers = torch.randn(2, 4, 48, generator=g)
    return folder, neurons, routers


def test_moefied_model_with_k_equal_e_is_the_dense_model(load, tiny_llama):
    folder, neurons, routers = tiny_llama
    loader, llama, moefy = load("model.loader"), load("model.llama"), load("moe.moefy")
    weights = loader.load_weights(folder, load_tokenizer=False)
    dense = llama.LlamaModel.from_state_dict(weights.config, weights.state_dict, "cpu", torch.float32)
    moe_config = moefy.moefied_config(weights.config, num_experts=4, top_k=4)
    moe_state = moefy.moefied_state_dict(weights.state_dict, neurons, routers)
    moe = llama.LlamaModel.from_state_dict(moe_config, moe_state, "cpu", torch.float32)
    ids = torch.randint(0, 101, (19,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = dense.sequence_logits(ids)
        torch.testing.assert_close(moe.sequence_logits(ids), expected, rtol=1e-5, atol=1e-5)
        for layer in moe.layers:
            layer.mlp.top_k = 1
        assert (
            moe.sequence_logits(ids) - expected
        ).abs().max() > 1e-3  # fewer experts: really a different model


def test_moefied_folder_loads_back_into_the_engine(load, tiny_llama, tmp_path):
    folder, neurons, routers = tiny_llama
    loader, moefy = load("model.loader"), load("moe.moefy")
    weights = loader.load_weights(folder, load_tokenizer=False)
    out = tmp_path / "moefied"
    moefy.write_folder(
        out,
        moefy.moefied_config(weights.config, 4, 4),
        moefy.moefied_state_dict(weights.state_dict, neurons, routers),
    )
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["num_local_experts"], config["moe_router"]) == (
        "moefied_llama",
        4,
        "unit",
    )
    LLM = load("llm").LLM
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [[5, 17, 3], [99, 1, 2, 3, 4, 5, 6, 7], [42]]
    options = dict(skip_tokenizer_init=True, device="cpu", dtype="float32", max_num_seqs=4)
    dense_out = [o.outputs[0].token_ids for o in LLM(str(folder), **options).generate(prompts, params)]
    moe_llm = LLM(str(out), **options)
    assert moe_llm.engine.model_config.num_local_experts == 4
    assert [o.outputs[0].token_ids for o in moe_llm.generate(prompts, params)] == dense_out


@pytest.mark.slow
def test_shipped_split_of_smollm2_reproduces_the_dense_model_at_k_equal_e(load):
    """The artefacts in data/moe/ applied to the bundled model: each neuron in one expert, k = E exact."""
    from safetensors.torch import load_file

    loader, llama, moefy = load("model.loader"), load("model.llama"), load("moe.moefy")
    path = moefy.artefact_path(8)
    cached = load_file(str(path))
    neurons, routers = cached["neurons"].long(), cached["routers"]
    weights = loader.load_weights()
    config = weights.config
    assert neurons.shape == (config.num_layers, 8, config.intermediate_size // 8)
    assert routers.shape == (config.num_layers, 8, config.hidden_size)
    for layer_neurons in neurons:
        assert sorted(layer_neurons.flatten().tolist()) == list(range(config.intermediate_size))
    dense = llama.LlamaModel.from_state_dict(config, weights.state_dict, "cpu", torch.float32)
    moe_config = moefy.moefied_config(config, 8, 8)
    moe = llama.LlamaModel.from_state_dict(
        moe_config, moefy.moefied_state_dict(weights.state_dict, neurons, routers), "cpu", torch.float32
    )
    ids = torch.tensor(
        weights.tokenizer.encode("And it came to pass in those days, that there went out a decree")
    )
    with torch.inference_mode():
        torch.testing.assert_close(moe.sequence_logits(ids), dense.sequence_logits(ids), rtol=1e-4, atol=1e-4)
