"""Greedy decoding gives one answer per prompt, however the engine computes it (issue 45, item 6).

A token's logits should not depend on the company its row keeps: decoded alone, in a batch with other
requests, after a prefix served from the prefix cache, or verified among a speculative step's ``1 + k`` rows,
each prompt should come out token for token the same. On the bundled model, float32 holds in every variant,
and an AWQ INT4 engine (float32 activations, cast to bfloat16 at each INT4 product) holds speculatively.

Not yet held, so not asserted here (measured on a 2-core Intel Xeon, Ice Lake: see the README): a bfloat16
engine (one of three prompts diverges at token 17 of 24 batched and speculatively), and the AWQ engine batched
or after a cached prefix (one prompt from token 4; token 1 with bfloat16 activations). torch's INT4 product is
row-invariant (a row's result is the same at every row count), but the rows around it are not: a lone decode
reads its context in place in block order, several rows attend through a padded, masked call, and a matrix
product may take another kernel for one row than for several. In float32 those differ in the last bits, and
the bfloat16 cast before every INT4 product turns a last-bit difference into a flipped bfloat16 rounding.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

SYSTEM = "You are a helpful assistant who answers briefly and precisely, in plain language."
QUESTIONS = ["Why is the sky blue?", "Name three prime numbers.", "What does a compiler do?"]
MAX_TOKENS = 32
DTYPES = {
    "float32": dict(dtype="float32"),
    "awq-int4": dict(dtype="float32", quantization="awq"),
}
HOLDS = {  # the variants each dtype holds to its lone decode (see the module's docstring for the others)
    "float32": ("batched", "after_prefix", "speculative"),
    "awq-int4": ("speculative",),
}
ENGINE = dict(device="cpu", max_num_seqs=4, max_model_len=512, kv_cache_memory=32 << 20)


@pytest.fixture(scope="module", params=list(DTYPES))
def variants(request, load):
    """Per dtype: each question's greedy tokens decoded alone (no prefix cache), batched, after a cached
    prefix, and speculatively (an EAGLE chain, batched)."""
    LLM, SamplingParams = load("llm").LLM, load("sampling_params").SamplingParams
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    options = ENGINE | DTYPES[request.param]
    plain = LLM(**options, enable_prefix_caching=False)
    prompts = [
        plain.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        )
        for q in QUESTIONS
    ]
    tokens = lambda outputs: [o.outputs[0].token_ids for o in outputs]  # noqa: E731
    alone = [tokens(plain.generate(p, params))[0] for p in prompts]
    batched = tokens(plain.generate(prompts, params))
    cached = LLM(**options, enable_prefix_caching=True)
    cached.generate(prompts[0], params)  # the system prompt's blocks enter the cache
    prefixed = [cached.generate(p, params)[0] for p in prompts]
    speculative = LLM(**options, speculative="eagle", num_speculative_tokens=3)
    spec_outputs = speculative.generate(prompts, params)
    return (
        request.param,
        dict(alone=alone, batched=batched, after_prefix=tokens(prefixed), speculative=tokens(spec_outputs)),
        (prefixed, spec_outputs),
    )


@pytest.mark.parametrize("variant", ["batched", "after_prefix", "speculative"])
def test_greedy_tokens_do_not_depend_on_the_batch(variants, variant):
    dtype, outputs, _ = variants
    if variant not in HOLDS[dtype]:
        pytest.skip(f"{dtype} {variant}: not row-invariant yet (the module's docstring says why)")
    for question, want, got in zip(QUESTIONS, outputs["alone"], outputs[variant], strict=True):
        first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        assert got == want, (
            f"{dtype}, {variant}: {question!r} diverged from its lone decode at token "
            f"{first} of {MAX_TOKENS}: "
            "a row's logits depend on its neighbours (a reduction split by the row count, or another kernel "
            "for several rows than for one)"
        )


def test_the_variants_ran_as_named(variants):
    """Else the comparisons would compare plain steps: the prefix cache served each prompt's shared blocks,
    and the EAGLE chain accepted drafts."""
    dtype, _, (prefixed, spec_outputs) = variants
    cached = [o.metrics.num_cached_tokens for o in prefixed]
    assert min(cached) > 0, f"{dtype}: a prompt found nothing in the prefix cache ({cached} tokens)"
    taus = [o.metrics.mean_acceptance_length or 1.0 for o in spec_outputs]
    assert max(taus) > 1.0, f"{dtype}: the EAGLE chain accepted no draft ({taus})"
