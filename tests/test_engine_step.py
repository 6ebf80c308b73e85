"""The order of a step's operations (engine/engine.py) and the reader's map of a step (tools/engine_map.py).

On the tiny model: fast, tokenizer-free. The tokens themselves are checked against the bundled model in
tests/test_engine_core.py."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import engine_map  # noqa: E402


@pytest.fixture
def tiny_llm(load, tiny_folder):
    def make(**options):
        return load("llm").LLM(
            model=str(tiny_folder), device="cpu", dtype="float32", skip_tokenizer_init=True, **options
        )

    return make


def test_every_step_that_runs_the_model_reads_its_results_back(load, tiny_llm):
    """A prompt chunked over several steps alone samples nothing until its last chunk; each step still does
    its one read, so no step's inputs are rewritten while the previous step's copy may be in flight (the
    staging buffers' invariant, input_batch.py)."""
    llm = tiny_llm(max_model_len=128, max_num_batched_tokens=4, enable_prefix_caching=False)
    engine, runner = llm.engine, llm.engine.runner
    events = []
    execute, read_tokens = runner.execute, runner.read_tokens

    def counted_execute(plan, **kwargs):
        events.append("execute")
        return execute(plan, **kwargs)

    def counted_read(token_ids, copy=None):
        events.append("read")
        return read_tokens(token_ids, copy)

    runner.execute, runner.read_tokens = counted_execute, counted_read
    params = load("sampling_params").SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    try:
        engine.add_request(list(range(3, 14)), params)  # 11 tokens: chunks of 4, 4, 3
        while engine.has_unfinished_requests():
            before = len(events)
            engine.step()
            assert events[before:] == ["execute", "read"], f"a step did {events[before:]}"
    finally:
        runner.execute, runner.read_tokens = execute, read_tokens
    assert events.count("execute") == 5  # 3 prefill chunks (the last one samples) + 2 decodes


def test_forked_completions_draw_as_lone_requests_with_their_seeds(load, tiny_llm):
    """n = 3 with seed s: completion i draws with seed s + i from the first one's logits row, then runs on
    blocks forked from it in the update path; each equals a lone request seeded s + i."""
    llm = tiny_llm(max_model_len=128)
    sp = load("sampling_params").SamplingParams
    prompt = list(range(5, 17))
    group = llm.generate([prompt], sp(n=3, temperature=1.0, seed=11, max_tokens=8, ignore_eos=True))[0]
    alone = [
        llm.generate([prompt], sp(temperature=1.0, seed=11 + i, max_tokens=8, ignore_eos=True))[0]
        for i in range(3)
    ]
    assert [c.token_ids for c in group.outputs] == [a.outputs[0].token_ids for a in alone]
    assert llm.engine.kv.num_used_blocks == 0


def test_the_step_fits_one_screen(load):
    """``Engine.step`` reads as its stages (schedule, execute, sample / verify, update, outputs)."""
    lines = inspect.getsource(load("engine.engine").Engine.step).splitlines()
    assert len(lines) <= 40, f"Engine.step is {len(lines)} lines"


def test_the_map_lists_every_engine_file_with_todays_line_counts():
    listed = {path for path, _ in engine_map.STAGES}
    engine_files = (ROOT / "solutions" / "engine").glob("*.py")
    files = {f"engine/{p.name}" for p in engine_files if p.name != "__init__.py"}
    assert files <= listed, f"not on tools/engine_map.py's STAGES: {sorted(files - listed)}"
    assert len(listed) == len(engine_map.STAGES), "a file is on the map twice"
    for name in engine_map.DOCS:
        block = engine_map.block_in((ROOT / name).read_text())
        assert block == engine_map.render(), f"{name}'s map is stale: run python tools/engine_map.py --write"
