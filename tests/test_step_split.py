"""``bench.step_split.measure_step_split``: a decode step taken apart while it runs
(correctness, never timing)."""

from __future__ import annotations

from solutions.bench.step_split import (
    SPLIT,
    STEP_KINDS,
    batched_split,
    measure_step_split,
    step_kind,
    step_linears,
)
from solutions.llm import LLM
from solutions.sampling_params import SamplingParams


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


def test_step_kind_names_prompt_chunks_decodes_and_their_mix():
    assert step_kind({"a": 1, "b": 1}) == "decode"
    assert step_kind({"a": 17}) == "prefill"
    assert step_kind({"a": 1, "b": 40}) == "mixed"


def test_a_batched_run_split_by_kind_accounts_for_every_token_and_its_timers_come_off(tiny_folder):
    """Prompts of 20-60 tokens in chunks of 32 beside decodes: every kind of step occurs, each request's
    tokens are all computed once (its prompt and every output but the last, which is sampled, never fed
    back), and the engine is left as it was."""
    llm = LLM(model=str(tiny_folder), device="cpu", max_num_seqs=4, max_num_batched_tokens=32,
              max_model_len=128, skip_tokenizer_init=True)  # fmt: skip
    prompts = [[(7 * i + j) % 100 for j in range(n)] for i, n in enumerate((20, 60, 33, 41))]
    outputs = [5, 9, 3, 12]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in outputs]
    split = batched_split(llm, prompts, params)
    assert set(split) == set(STEP_KINDS) and all(split[k].steps for k in STEP_KINDS), split
    assert sum(k.tokens for k in split.values()) == sum(map(len, prompts)) + sum(outputs) - len(prompts)
    for kind in split.values():
        assert set(kind.seconds) == set(SPLIT) and kind.total_s > 0
    assert "schedule" not in vars(llm.engine.scheduler) and "_sample" not in vars(llm.engine.runner)
    assert not llm.engine.has_unfinished_requests()
