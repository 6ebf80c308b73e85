"""The measured CPU linear paths: each computes F.linear's output,
and the decision cache is never trusted blindly."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from solutions.kernels import cpu_linear
from solutions.kernels.cpu_linear import PATHS, REGIMES, CpuLinear

AWKWARD_SHAPES = [(1, 1), (7, 13), (65, 33), (3, 130), (960, 576), (49, 1536)]


def supported_paths(dtype=torch.float32):
    return [name for name, path in PATHS.items() if path.supports(dtype)]


@pytest.mark.parametrize("path", supported_paths())
@pytest.mark.parametrize("out_features,in_features", AWKWARD_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@torch.no_grad()
def test_every_path_computes_f_linear(path, out_features, in_features, bias):
    generator = torch.Generator().manual_seed(out_features * 1000 + in_features)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=generator))
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=generator))
    layer = CpuLinear.from_linear(linear, dict.fromkeys(REGIMES, path))
    # one row (decode), a few (batch), many (prefill), and a 3-D input with a non-contiguous view
    for shape in [(1, in_features), (5, in_features), (70, in_features), (2, 3, in_features)]:
        x = torch.randn(*shape, generator=generator)
        expected = F.linear(x.double(), linear.weight.double(), None if not bias else linear.bias.double())
        with torch.inference_mode():
            got = layer(x)
        assert got.shape == expected.shape
        rel = float((got.double() - expected).norm() / expected.norm())
        assert rel < 1e-5, f"{path} on {out_features}x{in_features}, input {shape}: relative error {rel:.1e}"
    strided = torch.randn(in_features, 4, generator=generator).t()
    assert torch.allclose(layer(strided), F.linear(strided, linear.weight, linear.bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("path", [p for p in supported_paths() if p != "linear"])
def test_a_path_remakes_its_layout_after_the_weight_is_edited_in_place(path):
    linear = torch.nn.Linear(16, 8, bias=False)
    layer = CpuLinear.from_linear(linear, dict.fromkeys(REGIMES, path))
    x = torch.randn(1, 16)
    with torch.no_grad():
        layer(x)
        linear.weight.mul_(2)
        assert torch.allclose(layer(x), F.linear(x, linear.weight), rtol=1e-5, atol=1e-5)


def test_choices_must_name_known_paths_for_every_regime():
    linear = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="choices"):
        CpuLinear.from_linear(linear, {"decode": "linear"})
    with pytest.raises(ValueError, match="choices"):
        CpuLinear.from_linear(linear, dict.fromkeys(REGIMES, "magic"))


def test_forcing_an_unknown_path_is_an_error(monkeypatch):
    monkeypatch.setenv(cpu_linear.FORCE_ENV, "magic")
    with pytest.raises(ValueError, match="FASTMODE_CPU_LINEAR"):
        cpu_linear.forced_choices()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory for this test, and no forced path."""
    monkeypatch.setenv("FASTMODE_CACHE", str(tmp_path))
    monkeypatch.delenv(cpu_linear.FORCE_ENV, raising=False)
    return tmp_path / cpu_linear.CACHE_FILE


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 24, bias=False), torch.nn.Linear(24, 32, bias=False))


def test_a_missing_cache_is_measured_and_written(cache):
    model = tiny_model()
    decisions = cpu_linear.use_fastest_linears(model)
    assert set(decisions) == {"float32:24x32", "float32:32x24"}
    assert all(isinstance(m, CpuLinear) for m in model)
    assert cpu_linear.read_decisions(cache) == decisions
    for entry in decisions.values():
        for pick in entry.values():
            assert pick["path"] in supported_paths() and set(pick["us"]) == set(supported_paths())


def fake_decisions(path: str) -> dict:
    us = dict.fromkeys(PATHS, 1.0)
    return {key: {r: {"path": path, "us": us} for r in REGIMES} for key in ("float32:24x32", "float32:32x24")}


@pytest.mark.parametrize(
    "content",
    [
        "{ not json",
        "[]",
        json.dumps({"machine": "x", "decisions": {}}),
        # a well-formed file that holds decisions for another machine key only (here: another torch version)
        json.dumps(
            {
                "machines": [
                    {
                        "machine": {**cpu_linear.machine_key(), "torch": "0.0.1"},
                        "decisions": fake_decisions("linear"),
                    }
                ]
            }
        ),
    ],
    ids=["not-json", "not-an-object", "wrong-schema", "stale"],
)
def test_a_corrupt_or_stale_cache_is_ignored_and_rebuilt(cache, content, monkeypatch):
    cache.write_text(content)
    assert cpu_linear.read_decisions(cache) == {}
    measured = []
    real_measure = cpu_linear.measure_shape
    monkeypatch.setattr(
        cpu_linear, "measure_shape", lambda ws, **kw: measured.append(ws[0].shape) or real_measure(ws)
    )
    decisions = cpu_linear.use_fastest_linears(tiny_model())
    assert len(measured) == 2
    assert cpu_linear.read_decisions(cache) == decisions  # rewritten, for this machine


def test_entries_naming_unknown_paths_are_dropped_and_remeasured(cache):
    bad = fake_decisions("magic")
    cpu_linear.write_decisions(bad, cache)
    assert cpu_linear.read_decisions(cache) == {}
    good = fake_decisions("linear")
    cpu_linear.write_decisions(good, cache)
    assert cpu_linear.read_decisions(cache) == good  # a valid cache for this machine is used as it is
    model = tiny_model()
    cpu_linear.use_fastest_linears(model)
    assert all(m.choices == dict.fromkeys(REGIMES, "linear") for m in model)


def test_decisions_for_another_thread_count_are_kept_beside_this_ones(cache, monkeypatch):
    """The same CPU at one thread (the tests) and two (a notebook): each key's decisions stay in the file, so
    switching between them measures nothing again; the oldest keys beyond ``MAX_MACHINES`` are dropped."""
    one, two = ({**cpu_linear.machine_key(), "threads": n} for n in (1, 2))
    cpu_linear.write_decisions(fake_decisions("linear"), cache, machine=one)
    cpu_linear.write_decisions(fake_decisions("transposed"), cache, ["float32:24x32"], machine=two)
    assert cpu_linear.read_decisions(cache, one) == fake_decisions("linear")
    assert cpu_linear.read_decisions(cache, two) == fake_decisions("transposed")
    assert cpu_linear.noisy_keys(cache, one) == set() and cpu_linear.noisy_keys(cache, two) == {
        "float32:24x32"
    }
    for n in range(3, 3 + cpu_linear.MAX_MACHINES):
        cpu_linear.write_decisions(fake_decisions("linear"), cache, machine={**one, "threads": n})
    assert cpu_linear.read_decisions(cache, one) == {}, "the oldest key is dropped past MAX_MACHINES"
    assert cpu_linear.read_decisions(cache, {**one, "threads": 3}) == fake_decisions("linear")


def test_forced_path_skips_measuring(cache, monkeypatch):
    monkeypatch.setenv(cpu_linear.FORCE_ENV, "transposed")
    monkeypatch.setattr(cpu_linear, "measure_shape", lambda *a, **k: pytest.fail("measured although forced"))
    model = tiny_model()
    cpu_linear.use_fastest_linears(model)
    assert all(m.choices == dict.fromkeys(REGIMES, "transposed") for m in model)
    assert not cache.exists()


def test_a_tied_weight_stays_tied():
    embedding = torch.nn.Embedding(10, 4)
    model = torch.nn.Module()
    model.embed_tokens, model.lm_head = embedding, torch.nn.Linear(4, 10, bias=False)
    model.lm_head.weight = embedding.weight
    cpu_linear.use_fastest_linears(model, use_cache=False)
    assert isinstance(model.lm_head, CpuLinear) and model.lm_head.weight is model.embed_tokens.weight


def test_decisions_taken_on_a_busy_machine_are_retaken_when_it_is_quiet(cache, monkeypatch):
    monkeypatch.setattr(cpu_linear, "machine_busy", lambda: True)
    cpu_linear.use_fastest_linears(tiny_model())
    assert cpu_linear.noisy_keys(cache) == {"float32:24x32", "float32:32x24"}
    measured = []
    real_measure = cpu_linear.measure_shape
    monkeypatch.setattr(cpu_linear, "measure_shape", lambda ws, **kw: measured.append(1) or real_measure(ws))
    cpu_linear.use_fastest_linears(tiny_model())  # still busy: the cached (noisy) decisions are used
    assert measured == []
    monkeypatch.setattr(cpu_linear, "machine_busy", lambda: False)
    cpu_linear.use_fastest_linears(tiny_model())
    assert len(measured) == 2 and cpu_linear.noisy_keys(cache) == set()


def test_fastest_linear_wraps_a_bare_matrix_without_copying_it(monkeypatch):
    """For a matrix held as a tensor (the EAGLE head's draft vocabulary rows): ``x @ W.T``,
    W's storage shared."""
    monkeypatch.setenv(cpu_linear.FORCE_ENV, "transposed")
    weight = torch.randn(48, 16)
    linear = cpu_linear.fastest_linear(weight)
    x = torch.randn(3, 16)
    assert isinstance(linear, CpuLinear) and linear.bias is None and not linear.weight.requires_grad
    assert linear.weight.data_ptr() == weight.data_ptr()
    torch.testing.assert_close(linear(x), x @ weight.T)


def test_a_call_takes_the_smallest_row_bucket_that_holds_its_rows(monkeypatch):
    """1 row: decode; 2..64 rows: the first power-of-two bucket of at least that many; more: prefill. Each
    bucket's own path runs (a spy on the transposed path records the rows it ran)."""
    buckets = [cpu_linear.regime_of(r) for r in (1, 2, 3, 4, 5, 9, 17, 33, 64, 65, 1000)]
    assert (
        buckets
        == ["decode", "rows2", "rows4", "rows4", "rows8", "rows16", "rows32", "rows64", "rows64"]
        + ["prefill"] * 2
    )
    ran = []
    original = PATHS["transposed"]
    spy = cpu_linear.LinearPath(
        "transposed",
        original.store,
        lambda x, w, b: ran.append(x.shape[0]) or original.apply(x, w, b),
        original.supports,
    )
    monkeypatch.setitem(cpu_linear.PATHS, "transposed", spy)
    linear = torch.nn.Linear(32, 24, bias=False)
    layer = CpuLinear.from_linear(
        linear, {r: "transposed" if r in ("rows4", "rows32") else "linear" for r in REGIMES}
    )
    with torch.no_grad():
        for rows in (1, 2, 3, 4, 5, 20, 32, 33, 70):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(layer(x), F.linear(x, linear.weight), rtol=1e-4, atol=1e-5)
    assert ran == [3, 4, 20, 32], f"the transposed path (rows4, rows32 buckets) ran for {ran} rows"


def test_a_regime_keeps_a_layout_already_held_when_it_is_nearly_as_fast():
    """Each layout beside the weight is a copy of it: a regime takes a path another regime already uses when
    that path is within LAYOUT_SLACK of its fastest, and its own fastest otherwise."""
    us = {
        "decode": {"linear": 10.0, "transposed": 9.0, "onednn": 20.0},  # transposed wins clearly
        "rows2": {"linear": 10.0, "transposed": 12.0, "onednn": 12.0},  # linear clearly
        "prefill": {"linear": 50.0, "transposed": 30.0, "onednn": 29.0},  # onednn by 3%: transposed is held
    }
    regimes = {regime: us.get(regime, us["rows2"]) for regime in REGIMES}
    decision = {regime: {"path": min(t, key=t.get), "us": t} for regime, t in regimes.items()}
    choices = cpu_linear.economical_choices(decision)
    assert choices["decode"] == "transposed" and choices["prefill"] == "transposed"
    assert set(choices.values()) == {"linear", "transposed"}, choices
