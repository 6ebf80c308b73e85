"""``bench kv``'s accounting of KV memory (hand-checked small cases) and its prefix-TTFT measurement."""

from __future__ import annotations

import pytest

from solutions.bench import kv


def test_memory_use_sums_rows_over_every_decode_step():
    mix = [kv.RequestShape(prompt_len=3, output_len=2)]  # holds 4 tokens after step 1, 5 after step 2
    assert kv.memory_use(mix, kv.paged(4)) == kv.MemoryUse(reserved=4 + 8, used=4 + 5)
    assert kv.memory_use(mix, kv.contiguous_max_len(10)) == kv.MemoryUse(reserved=20, used=9)
    assert kv.memory_use(mix, kv.contiguous_exact()) == kv.MemoryUse(reserved=10, used=9)
    assert kv.MemoryUse(reserved=20, used=9).waste == pytest.approx(0.55)


def test_paged_waste_is_under_one_block_per_sequence():
    mix = kv.sample_request_mix(200, max_model_len=512, seed=3)
    use = kv.memory_use(mix, kv.paged(16))
    steps = sum(s.output_len for s in mix)
    assert 0 <= use.reserved - use.used <= 15 * steps, (
        "a paged sequence leaves at most block_size - 1 rows unused"
    )


def test_max_concurrent_packs_final_lengths_in_order():
    mix = [kv.RequestShape(3, 2)] * 3  # 5 tokens each: 2 blocks of 4
    assert kv.max_concurrent(mix, budget_rows=20, reserve=kv.paged(4)) == 2
    assert kv.max_concurrent(mix, budget_rows=20, reserve=kv.contiguous_max_len(10)) == 2
    assert kv.max_concurrent(mix, budget_rows=9, reserve=kv.contiguous_max_len(10)) == 0


def test_request_mix_is_seeded_and_fits_the_context():
    mix = kv.sample_request_mix(500, max_model_len=300, seed=1)
    assert mix == kv.sample_request_mix(500, max_model_len=300, seed=1)
    assert all(s.prompt_len >= 1 and s.output_len >= 1 and s.total_len <= 300 for s in mix)
    with pytest.raises(ValueError, match="max_model_len"):
        kv.sample_request_mix(1, max_model_len=1)


def test_kv_bytes_per_token_of_the_bundled_model():
    assert kv.kv_bytes_per_token(num_layers=30, num_kv_heads=3, head_dim=64, dtype_bytes=4) == 46_080


@pytest.mark.slow
def test_prefix_ttft_reuses_the_shared_prefix_only(llm):
    result = kv.measure_prefix_ttft(llm, prefix_len=64, rounds=2)
    assert len(result.cached) == len(result.uncached) == 2
    assert all(t > 0 for t in result.cached + result.uncached)
    assert result.hit_tokens == [64, 64], (
        "each cached request reuses the whole 64-token prefix (4 blocks of 16)"
    )
