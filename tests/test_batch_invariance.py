"""Greedy decoding gives one answer per prompt, however the engine computes it (issue 45, item 6).

A token's logits should not depend on the company its row keeps: decoded alone, in a batch with other
requests, after a prefix served from the prefix cache, or verified among a speculative step's ``1 + k`` rows,
each prompt should come out token for token the same.

With ``FASTMODE_BATCH_INVARIANT=1`` (``kernels/batch_invariant.py``) that holds by construction on the CPU
paths: float32, and AWQ INT4 with float32 or bfloat16 activations (the linears, attention, tree attention and
elementwise chains are made so). By default it holds for
float32 on the bundled model (last-bit differences rarely flip a float32 argmax), not for INT4: a bfloat16
cast before every INT4 product turns a last-bit difference from the attention (a lone decode reads its context
in place, several rows attend through a padded, masked call) into a flipped bfloat16 rounding, and near-ties
flip within tens of tokens. The invariant mode runs every linear on the packed kernel
(``kernels/cpu_rows.c``), row-invariant in float32, bfloat16 and INT4.
"""

from __future__ import annotations

import gc

import pytest
import torch

SYSTEM = "You are a helpful assistant who answers briefly and precisely, in plain language."
QUESTIONS = ["Why is the sky blue?", "Name three prime numbers.", "What does a compiler do?"]
MAX_TOKENS = 32
CASES = {  # (dtype options, FASTMODE_BATCH_INVARIANT)
    "float32": (dict(dtype="float32"), "0"),
    "float32-invariant": (dict(dtype="float32"), "1"),
    "awq-int4-invariant": (dict(dtype="float32", quantization="awq"), "1"),
    "awq-int4-bf16-activations-invariant": (dict(dtype="bfloat16", quantization="awq"), "1"),
}
ENGINE = dict(device="cpu", max_num_seqs=4, max_model_len=512, kv_cache_memory=32 << 20)


@pytest.fixture(scope="module", params=list(CASES))
def variants(request, load):
    """Per case: each question's greedy tokens decoded alone (no prefix cache), batched, after a cached
    prefix, and speculatively (an EAGLE chain and an EAGLE tree, batched); and the outputs that show each
    variant ran."""
    LLM, SamplingParams = load("llm").LLM, load("sampling_params").SamplingParams
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    options, invariant = CASES[request.param]
    tokens = lambda outputs: [o.outputs[0].token_ids for o in outputs]  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FASTMODE_BATCH_INVARIANT", invariant)
        plain = LLM(**ENGINE, **options, enable_prefix_caching=False)
        prompts = [
            plain.tokenizer.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            )
            for q in QUESTIONS
        ]
        alone = [tokens(plain.generate(p, params))[0] for p in prompts]
        batched = tokens(plain.generate(prompts, params))
        del plain  # one engine at a time (four at once held 7 GB); engines hold cycles: collect them
        gc.collect()
        cached = LLM(**ENGINE, **options, enable_prefix_caching=True)
        cached.generate(prompts[0], params)  # the system prompt's blocks enter the cache
        prefixed = [cached.generate(p, params)[0] for p in prompts]
        del cached
        gc.collect()
        speculative = LLM(**ENGINE, **options, speculative="eagle", num_speculative_tokens=3)
        spec_outputs = speculative.generate(prompts, params)
        del speculative
        gc.collect()
        tree = LLM(
            **ENGINE, **options, speculative="eagle", num_speculative_tokens=4, speculative_tree_nodes=8
        )
        tree_outputs = tree.generate(prompts, params)
        del tree
        gc.collect()
    outputs = dict(
        alone=alone,
        batched=batched,
        after_prefix=tokens(prefixed),
        speculative=tokens(spec_outputs),
        speculative_tree=tokens(tree_outputs),
    )
    return request.param, outputs, (prefixed, spec_outputs + tree_outputs)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["batched", "after_prefix", "speculative", "speculative_tree"])
def test_greedy_tokens_do_not_depend_on_the_batch(variants, variant):
    case, outputs, _ = variants
    for question, want, got in zip(QUESTIONS, outputs["alone"], outputs[variant], strict=True):
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        assert got == want, (
            f"{case}, {variant}: {question!r} diverged from its lone decode at token {first} of "
            f"{MAX_TOKENS}: a row's logits depend on its neighbours (a reduction split by the row count, or "
            "another kernel for several rows than for one)"
        )


@pytest.mark.slow
def test_the_variants_ran_as_named(variants):
    """Else the comparisons would compare plain steps: the prefix cache served each prompt's shared blocks,
    and the EAGLE chain and tree accepted drafts."""
    case, _, (prefixed, spec_outputs) = variants
    cached = [o.metrics.num_cached_tokens for o in prefixed]
    assert min(cached) > 0, f"{case}: a prompt found nothing in the prefix cache ({cached} tokens)"
    taus = [o.metrics.mean_acceptance_length or 1.0 for o in spec_outputs]
    half = len(taus) // 2
    assert max(taus[:half]) > 1.0 and max(taus[half:]) > 1.0, (
        f"{case}: chain or tree accepted nothing ({taus})"
    )


def test_invariant_attention_gives_each_row_what_it_gets_alone(load, monkeypatch):
    """A verify-shaped step (a decode, then a 4-row chain over a shared context) against each row attended
    alone as a lone decode over its own context: bit for bit under FASTMODE_BATCH_INVARIANT=1."""
    monkeypatch.setenv("FASTMODE_BATCH_INVARIANT", "1")
    paged = load("kernels.paged_torch")
    generator = torch.Generator().manual_seed(0)
    block_size, heads, kv_heads, dim = 16, 9, 3, 64
    k_cache, v_cache = torch.randn(2, 24, block_size, kv_heads, dim, generator=generator)
    q = torch.randn(5, heads, dim, generator=generator)
    # sequence 0: one decode over 37 tokens in blocks 5, 3, 9 (gathered); sequence 1: 4 rows ending at 60
    # tokens in blocks 10..13 (one ascending run, read in place)
    table = torch.tensor([[5, 3, 9, 0], [10, 11, 12, 13]], dtype=torch.int32)
    step = paged.TorchPagedStep(
        table, torch.tensor([0, 1, 5]), torch.tensor([37, 60]), block_size, 60, torch.float32
    )
    together = step.attend(q, k_cache, v_cache)
    for row, (seq, length) in enumerate([(0, 37), (1, 57), (1, 58), (1, 59), (1, 60)]):
        lone = paged.TorchPagedStep(
            table[seq : seq + 1],
            torch.tensor([0, 1]),
            torch.tensor([length]),
            block_size,
            length,
            torch.float32,
        )
        alone = lone.attend(q[row : row + 1], k_cache, v_cache)
        assert torch.equal(together[row], alone[0]), f"row {row} differs from its lone decode"
    reference = load("kernels.reference")
    starts, lens = torch.tensor([0, 1, 5]), torch.tensor([37, 60])
    expected = reference.reference_paged_attention(
        q.double(), k_cache.double(), v_cache.double(), table, starts, lens
    )
    assert float((together.double() - expected).abs().max()) < 1e-5, "invariant attention is not attention"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_invariant_linears_give_a_lone_row_what_it_gets_among_others(load, monkeypatch, dtype):
    """Under FASTMODE_BATCH_INVARIANT=1 a linear runs the packed kernel at every row count (each row summed in
    one order), or where there is no C compiler oneDNN, a lone row padded to two: a row's output is the same
    bit for bit alone and among 1..64 others, also for an input wider than 1024 (where oneDNN's one-row kernel
    sums in another order)."""
    monkeypatch.setenv("FASTMODE_BATCH_INVARIANT", "1")
    monkeypatch.delenv("FASTMODE_CPU_LINEAR", raising=False)
    cpu_linear = load("kernels.cpu_linear")
    if not any(cpu_linear.PATHS[name].supports(dtype) for name in ("packed", "onednn")):
        pytest.skip(f"neither the packed kernel nor oneDNN computes {dtype} here")
    generator = torch.Generator().manual_seed(0)
    holder = torch.nn.Module()
    holder.linear = torch.nn.Linear(1536, 96, bias=True, dtype=dtype)
    cpu_linear.use_linear_decisions(holder, {})  # no measured decision: the invariant mode's choice alone
    linear = holder.linear
    packed = cpu_linear.PATHS["packed"].supports(dtype)
    assert isinstance(linear, cpu_linear.CpuLinear)
    assert set(linear.choices.values()) == {"packed" if packed else "onednn"}
    assert linear.pad_single_row != packed
    x = torch.randn(65, 1536, generator=generator).to(dtype)
    with torch.no_grad():
        alone = torch.cat([linear(x[i : i + 1]) for i in range(65)])
        for rows in (2, 3, 8, 17, 65):
            assert torch.equal(linear(x[:rows]), alone[:rows]), f"{rows} rows differ from each row alone"
        expected = torch.nn.functional.linear(x.double(), linear.weight.double(), linear.bias.double())
        atol = 1e-2 if dtype == torch.bfloat16 else 1e-4
        assert torch.allclose(alone.double(), expected, rtol=1e-2, atol=atol)
