"""Lesson 2: prefix caching by chained block hashes, its LRU of freed cached blocks, and truncation."""

from __future__ import annotations

import pytest
from fake_request import FakeRequest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.lab2

BS = 4


@pytest.fixture(scope="module")
def prefix(load):
    return load("cache.prefix_cache")


@pytest.fixture(scope="module")
def manager_class(load):
    return load("cache.kv_cache_manager").KVCacheManager


def hit(manager, request: FakeRequest) -> int:
    """How many of ``request``'s tokens the prefix cache holds (a look-up: it takes nothing)."""
    return manager.lookup_prefix(request).num_tokens


def run(manager, request: FakeRequest) -> int:
    """Admit ``request``, compute all its tokens in one step, register its full blocks; return the hit."""
    prefix = manager.lookup_prefix(request)
    assert manager.allocate_slots(request, request.num_tokens - prefix.num_tokens, prefix), (
        f"no room for {request.request_id}'s tokens"
    )
    request.num_computed = request.num_tokens
    manager.cache_full_blocks(request)
    return prefix.num_tokens


# ---------------------------------------------------------------- the hash chain


@settings(max_examples=100, deadline=None)
@given(tokens=st.lists(st.integers(0, 50_000), min_size=BS, max_size=8 * BS), data=st.data())
def test_one_changed_token_diverges_the_chain_from_its_block_on(prefix, tokens, data):
    keys = prefix.chain_block_hashes(tokens, BS)
    assert len(keys) == len(tokens) // BS, "one key per full block; a partial block has none"
    assert prefix.chain_block_hashes(list(tokens), BS) == keys, "the same tokens must give the same keys"
    position = data.draw(st.integers(0, len(keys) * BS - 1))
    changed = list(tokens)
    changed[position] += 1
    other = prefix.chain_block_hashes(changed, BS)
    first = position // BS
    assert other[:first] == keys[:first], "blocks before the changed token must keep their keys"
    for index in range(first, len(keys)):
        assert other[index] != keys[index], (
            f"block {index} comes after the change at block {first} but kept its key: each key must chain "
            "its parent's key, not hash only its own tokens"
        )


def test_same_block_tokens_after_different_prefixes_get_different_keys(prefix):
    a = prefix.chain_block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS)
    b = prefix.chain_block_hashes([5, 6, 7, 8, 9, 9, 9, 9], BS)
    assert a[1] != b[1], "the second blocks hold the same tokens after different pasts: their K/V differ"
    resumed = prefix.chain_block_hashes([1, 2, 3, 4, 9, 9, 9, 9], BS, start=1, parent=a[0])
    assert resumed == a[1:], "hashing can resume from a parent key"


# ---------------------------------------------------------------- reuse through the manager


def test_same_prefix_reuses_the_same_blocks(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    system = list(range(100, 112))  # three full blocks
    first = FakeRequest("a", system + [1, 2])
    assert run(manager, first) == 0, "the first request finds nothing cached"
    second = FakeRequest("b", system + [3, 4, 5])
    assert run(manager, second) == 12, "the three full blocks of the shared prefix must be reused"
    assert manager.block_table("b")[:3] == manager.block_table("a")[:3]
    assert manager.block_table("b")[3] != manager.block_table("a")[3], "the differing tail gets its own block"
    assert all(manager.allocator.ref_counts[b] == 2 for b in manager.block_table("a")[:3]), "a hit increfs"


def test_a_changed_token_reuses_only_the_blocks_before_it(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    tokens = list(range(16))
    run(manager, FakeRequest("a", tokens + [99]))
    changed = list(tokens)
    changed[9] = -5  # in block 2
    assert run(manager, FakeRequest("b", changed + [99])) == 8, (
        "blocks 0 and 1 match; the chain diverges at block 2"
    )


def test_at_least_one_token_is_left_to_compute(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    tokens = list(range(12))
    run(manager, FakeRequest("a", tokens))
    again = FakeRequest("b", tokens)  # the same 12 tokens: 3 full cached blocks
    found = hit(manager, again)
    assert found == 8, (
        f"reused {found} of 12 tokens: at most num_tokens - 1 may be reused, in whole blocks, so the step "
        "still has a token to compute (the logits of the next token come from it)"
    )


def test_without_prefix_caching_nothing_is_reused(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS, enable_prefix_caching=False)
    run(manager, FakeRequest("a", list(range(13))))
    assert run(manager, FakeRequest("b", list(range(13)))) == 0


def test_a_duplicate_block_stays_uncached(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    tokens = list(range(9))
    a, b = FakeRequest("a", tokens), FakeRequest("b", tokens)
    for r in (a, b):  # both admitted before either computed anything: no hit for b
        assert hit(manager, r) == 0, "nothing is cached before either request computed a block"
        manager.allocate_slots(r, r.num_tokens, manager.lookup_prefix(r))
    for r in (a, b):
        r.num_computed = r.num_tokens
        manager.cache_full_blocks(r)
        manager.cache_full_blocks(r)  # idempotent
    assert manager.prefix_cache.num_cached == 2, "one block per key: b's copies of a's blocks stay uncached"
    assert not any(manager.prefix_cache.is_cached(block) for block in manager.block_table("b"))
    manager.free(b)
    assert manager.prefix_cache.num_evictable == 0, "b's uncached blocks go straight back to the free list"


def test_freed_cached_blocks_are_reused_then_evicted_oldest_first(manager_class):
    manager = manager_class(num_blocks=7, block_size=BS)  # 6 usable blocks
    a = FakeRequest("a", list(range(8)) + [50])  # blocks: 2 full + 1 partial
    run(manager, a)
    a_full = manager.block_table("a")[:2]
    manager.free(a)
    assert manager.num_free_blocks == 6, "cached blocks with no reference still count as free"
    assert sorted(manager.prefix_cache.evictable_blocks()) == sorted(a_full), (
        "a's full blocks keep their contents in the LRU; its partial block goes back to the free list"
    )
    assert manager.prefix_cache.evictable_blocks() == a_full[::-1], (
        "freed last block first: the tail is evicted first"
    )
    b = FakeRequest("b", list(range(8)) + [60])
    assert run(manager, b) == 8, "a freed cached prefix must still be found"
    assert manager.prefix_cache.num_evictable == 0, "reused blocks leave the LRU"
    manager.free(b)
    c = FakeRequest("c", [70 + i for i in range(17)])  # 5 blocks: 4 free + 1 eviction
    run(manager, c)
    assert manager.prefix_cache.evictable_blocks() == [a_full[0]], (
        "evict the least recently freed block first"
    )
    assert hit(manager, FakeRequest("d", list(range(9)))) == 4, "the evicted tail is gone, the head is not"


def test_evicted_block_contents_are_not_found_again(manager_class):
    manager = manager_class(num_blocks=3, block_size=BS)  # 2 usable blocks
    run(manager, FakeRequest("a", [1, 2, 3, 4, 5]))
    manager.free(FakeRequest("a", []))
    run(manager, FakeRequest("b", [9, 9, 9, 9, 9, 9, 9, 9]))  # needs both blocks: evicts a's
    assert manager.prefix_cache.lookup(manager.prefix_cache.block_to_hash.get(1, b"")) in (None, 1)
    assert hit(manager, FakeRequest("c", [1, 2, 3, 4, 5])) == 0, "an evicted block must not hit"


def test_truncate_drops_blocks_and_a_rewritten_cached_block_is_uncached(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    a = FakeRequest("a", list(range(11)))
    run(manager, a)
    table = manager.block_table("a")
    free_before = manager.num_free_blocks
    manager.truncate(a, 6)  # keep positions 0..5: blocks 0 and 1 (block 1 partly)
    assert manager.block_table("a") == table[:2] and manager.num_free_blocks == free_before + 1
    assert manager.prefix_cache.is_cached(table[1]), "block 1 still holds the tokens its key names"
    a.token_ids, a.num_computed = a.token_ids[:6] + [-1, -2], 6
    assert manager.allocate_slots(a, 2), "2 tokens into a block 'a' holds alone: no new block needed"
    assert manager.block_table("a")[1] == table[1] and not manager.prefix_cache.is_cached(table[1]), (
        "writing into a cached block held by this request alone must first forget its key"
    )
    b = FakeRequest("b", list(range(11)))
    assert hit(manager, b) == 4, "only block 0 still matches the original tokens"


def test_blocks_rewritten_after_truncate_are_cached_under_their_new_tokens(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    original = list(range(13))
    a = FakeRequest("a", original)
    run(manager, a)
    manager.truncate(a, 5)  # the drafts after position 4 were rejected: blocks 0 and 1 (partly) stay
    a.token_ids, a.num_computed = original[:5] + [-1, -2, -3, -4, -5, -6, -7, -8], 5
    assert manager.allocate_slots(a, 8), (
        "8 tokens after truncation, 13 blocks free: allocate_slots must succeed"
    )
    a.num_computed = 13
    manager.cache_full_blocks(a)
    assert run(manager, FakeRequest("new", a.token_ids + [0])) == 12, (
        "the rewritten blocks are found by their new tokens"
    )
    assert run(manager, FakeRequest("old", original + [0])) == 4, (
        "only block 0 still holds the original tokens: after truncate, keys of blocks past "
        "num_tokens // block_size must be forgotten, or rewritten blocks are registered under stale keys"
    )


def test_free_registers_the_full_blocks_computed_so_far(manager_class):
    manager = manager_class(num_blocks=16, block_size=BS)
    a = FakeRequest("a", list(range(10)))
    manager.allocate_slots(a, 10)
    a.num_computed = 10
    manager.free(a)  # finished in the step that computed its prompt: cache_full_blocks never ran
    assert run(manager, FakeRequest("b", list(range(10)) + [5])) == 8, (
        "free must register the request's full computed blocks first, "
        "or a one-step request leaves nothing cached"
    )


def test_a_look_up_takes_nothing_and_a_refused_admission_leaves_no_trace(manager_class):
    """``lookup_prefix`` only reads; ``allocate_slots`` takes the prefix's blocks with the fresh ones, all or
    nothing, so a refused admission holds nothing and the cached prefix stays evictable, in LRU order."""
    manager = manager_class(num_blocks=6, block_size=BS)  # 5 usable blocks
    run(manager, FakeRequest("a", list(range(8)) + [50]))  # 2 full blocks cached, 1 partial
    manager.free(FakeRequest("a", []))
    lru = manager.prefix_cache.evictable_blocks()
    big = FakeRequest("b", list(range(8)) + list(range(100, 116)))  # the 2 cached blocks, then 4 more
    prefix = manager.lookup_prefix(big)
    assert prefix.num_tokens == 8 and list(prefix.blocks) == lru[::-1], (
        f"the look-up found {prefix.num_tokens} tokens in blocks {list(prefix.blocks)}: a's two full blocks, "
        "in token order, were expected"
    )
    assert manager.prefix_cache.evictable_blocks() == lru and manager.num_used_blocks == 0, (
        "lookup_prefix changed the cache: a look-up takes no block and reorders nothing"
    )
    assert not manager.allocate_slots(big, 16, prefix), (
        "4 fresh blocks wanted, 3 free once the prefix is taken"
    )
    assert not manager.holds("b") and manager.num_used_blocks == 0, "a refused admission must hold nothing"
    assert manager.prefix_cache.evictable_blocks() == lru, "a refused admission must leave the LRU as it was"
    assert manager.allocate_slots(big, 12, prefix), (
        "3 fresh blocks wanted, 3 free: the admission must succeed"
    )
    assert manager.block_table("b")[:2] == list(prefix.blocks) and manager.prefix_cache.num_evictable == 0
