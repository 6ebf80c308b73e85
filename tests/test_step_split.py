"""``bench.step_split.measure_step_split``: a decode step taken apart while it runs
(correctness, never timing)."""

from __future__ import annotations

from solutions.bench.step_split import SPLIT, measure_step_split, step_linears


def test_the_parts_add_up_to_the_step_and_the_timers_come_off(llm):
    model = llm.engine.model
    ops_before = model.ops
    split = measure_step_split(llm, "The printing press", new_tokens=4, repeats=1)
    assert set(split.ms) == set(SPLIT) and split.steps == 3
    for part in SPLIT:
        assert split.ms[part] > 0, f"{part}: {split.ms[part]} ms; every part of a decode step takes some time"
    assert abs(sum(split.ms.values()) - split.step_ms) < 1e-9
    wrapped = [
        m for m in [model, model.norm, model.embed_tokens, *step_linears(model)] if "forward" in vars(m)
    ]
    assert not wrapped and model.ops is ops_before, "the timers must be removed after measuring"
    assert "step" not in vars(llm.engine) and "_sample" not in vars(llm.engine)
