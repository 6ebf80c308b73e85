"""``bench.step_split.measure_step_split``: a decode step taken apart while it runs
(correctness, never timing)."""

from __future__ import annotations

from solutions.bench.step_split import SPLIT, measure_step_split, step_linears


def test_the_parts_add_up_to_the_step_and_the_timers_come_off(llm):
    model = llm.engine.model
    ops_before, fused_before = model.ops, model.fused_decode
    attention_before = getattr(fused_before, "attention", None)
    split = measure_step_split(llm, "The printing press", new_tokens=4, repeats=1)
    assert set(split.ms) == set(SPLIT) and split.steps == 3
    assert split.ms["compiled layers"] == 0  # a float model's layers: their products and attention are timed
    for part in (p for p in SPLIT if p != "compiled layers"):
        assert split.ms[part] > 0, f"{part}: {split.ms[part]} ms; every part of a decode step takes some time"
    assert abs(sum(split.ms.values()) - split.step_ms) < 1e-9
    wrapped = [
        m for m in [model, model.norm, model.embed_tokens, *step_linears(model)] if "forward" in vars(m)
    ]
    assert not wrapped and model.ops is ops_before, "the timers must be removed after measuring"
    assert model.fused_decode is fused_before and getattr(fused_before, "attention", None) is attention_before
    assert "step" not in vars(llm.engine) and "_sample" not in vars(llm.engine.runner)
