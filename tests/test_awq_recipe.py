"""AWQ's calibration recipe over a whole model (``quant/calibrate.py``): which pairs are scaled, duo scaling,
which linears are clipped, and the cache an ablation shares between recipes. A tiny random model with GQA
ratio 3, as SmolLM2's."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import random_llama

from solutions.model.config import ModelConfig
from solutions.quant.calibrate import Recipe, calibration_ids, capture_inputs, search_params
from solutions.quant.model import apply_awq_scales

TINY = ModelConfig(
    vocab_size=89, hidden_size=48, intermediate_size=64, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=128, tie_word_embeddings=True,
)  # fmt: skip
GROUP, WINDOW = 16, 32
QK_ROWS = (TINY.num_heads + TINY.num_kv_heads) * TINY.head_dim


@pytest.fixture(scope="module")
def tiny():
    model = random_llama(TINY, torch.float32)
    ids = torch.randint(0, TINY.vocab_size, (2 * WINDOW,), generator=torch.Generator().manual_seed(0))
    return model, capture_inputs(model, ids, WINDOW)


def params_for(tiny, recipe, cache=None):
    model, inputs = tiny
    return search_params(model, inputs, 3, GROUP, WINDOW, recipe, cache)


def test_clip_modes_leave_the_named_rows_unclipped(tiny):
    every = params_for(tiny, Recipe(clip="all"))
    no_qk = params_for(tiny, Recipe(clip="no_qk", clip_lm_head=False))
    none = params_for(tiny, Recipe(clip="none", clip_lm_head=False))
    qkv = "layers.0.qkv_proj.clip"
    assert every[qkv][:QK_ROWS].any(), "at 3 bits some q/k row should find a clip worth taking"
    assert not no_qk[qkv][:QK_ROWS].any(), "clip='no_qk' must leave q and k rows at index 0 (no clipping)"
    assert torch.equal(no_qk[qkv][QK_ROWS:], every[qkv][QK_ROWS:]), "v rows are searched as before"
    assert torch.equal(no_qk["layers.1.down_proj.clip"], every["layers.1.down_proj.clip"])
    assert not no_qk["lm_head.clip"].any() and every["lm_head.clip"].any()
    assert not any(v.any() for k, v in none.items() if k.endswith(".clip"))


def test_a_pair_turned_off_gets_unit_scales(tiny):
    params = params_for(tiny, Recipe(pairs=("qkv", "down")))
    assert torch.equal(params["layers.1.gate_up_proj.scales"], torch.ones(TINY.hidden_size).half())
    assert not torch.equal(params["layers.1.qkv_proj.scales"], torch.ones(TINY.hidden_size).half())
    assert not any(k.endswith("o_proj.scales") for k in params), "v -> o is never scaled under GQA"


def test_duo_scaling_is_the_published_formula_at_one_alpha_of_the_grid(tiny):
    model, inputs = tiny
    params = params_for(tiny, Recipe(duo_scaling=True))
    weight, x = model.layers[1].mlp.down_proj.weight, inputs["layers.1.down_proj"]
    grouped = weight.abs().view(weight.shape[0], -1, GROUP)
    w_mean = (grouped / grouped.amax(-1, keepdim=True)).view_as(weight).mean(0)
    x_mean = x.abs().mean(0)
    got = params["layers.1.down_proj.scales"].float()
    for alpha in (i / 20 for i in range(20)):
        s = x_mean.pow(alpha) / w_mean.pow(1 - alpha)
        s = s / (s.max() * s.min()).sqrt()
        if torch.allclose(s, got, rtol=2e-3):
            return
    raise AssertionError("duo scales are not mean|x|**a / mean|w|**(1 - a), normalised, for an a of the grid")


def test_the_cache_returns_the_same_params_and_the_folded_scales_keep_the_function(tiny):
    model, _ = tiny
    cache = {}
    first = params_for(tiny, Recipe(clip="no_qk"), cache)
    searched = len(cache)
    again = params_for(tiny, Recipe(clip="no_qk"), cache)
    assert len(cache) == searched and all(torch.equal(first[k], again[k]) for k in first)
    params_for(tiny, Recipe(clip="none"), cache)
    assert len(cache) > searched, "another clip mode is another search"
    net = copy.deepcopy(model)
    apply_awq_scales(net, first)
    ids = torch.arange(10)
    expected, folded = model.sequence_logits(ids), net.sequence_logits(ids)
    assert (folded - expected).abs().max() < 1e-3 * expected.abs().max()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"pairs": ("qkv", "vo")}, "unknown scaled pair"), ({"clip": "qk"}, "clip must be one of")],
    ids=["pair", "clip"],
)
def test_a_bad_recipe_names_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Recipe(**kwargs)


def test_calibration_ids_take_an_equal_share_of_each_text(tmp_path):
    class Letters:  # one token per character
        def encode(self, text):
            return [ord(c) for c in text]

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("abcdef")
    b.write_text("xyz")
    assert calibration_ids(Letters(), [a, b], 6).tolist() == [ord(c) for c in "abcxyz"]
    with pytest.raises(ValueError, match="b.txt has only 3 tokens, 4 asked for"):
        calibration_ids(Letters(), [a, b], 8)
