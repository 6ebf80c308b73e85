"""Lesson 2: the block allocator and the KV-cache manager's fork / copy-on-write / free (Lab 2).

The property tests drive the manager through random allocate / fork / append / truncate / free
sequences, with small block pools so that blocks run out and cached blocks get evicted, and keep a
model of the KV memory: each slot holds the token whose K/V was written there. After every step
every block is accounted for exactly once, reference counts equal the number of tables listing a
block, and every live request reads its own tokens back through its block table.
"""

from __future__ import annotations

import collections
import re

import pytest
from fake_request import FakeRequest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

pytestmark = pytest.mark.lab2


@pytest.fixture(scope="module")
def allocator_module(load):
    return load("cache.block_allocator")


@pytest.fixture(scope="module")
def manager_class(load):
    return load("cache.kv_cache_manager").KVCacheManager


def expect_value_error(call, match: str, why: str) -> None:
    """``call()`` must raise a ValueError whose message matches ``match``; fail with ``why`` otherwise."""
    try:
        call()
    except ValueError as error:
        assert re.search(match, str(error)), f"{why}; the ValueError must name it ({match!r}), got: {error}"
        return
    raise AssertionError(f"{why}, but no ValueError was raised")


# -------------------------------------------------------------- the allocator alone


def test_allocator_never_hands_out_the_null_block(allocator_module):
    allocator = allocator_module.BlockAllocator(5)
    blocks = [allocator.allocate() for _ in range(4)]
    assert sorted(blocks) == [1, 2, 3, 4], (
        "blocks 1..num_blocks-1 are handed out; block 0 is the reserved null block"
    )
    assert allocator.num_free == 0, f"4 of 4 blocks handed out, yet num_free is {allocator.num_free}"
    with pytest.raises(RuntimeError):
        allocator.allocate()


def test_decref_rejects_double_free_and_foreign_blocks(allocator_module):
    allocator = allocator_module.BlockAllocator(4)
    block = allocator.allocate()
    assert allocator.decref(block) == 0, "decref returns the new reference count"
    expect_value_error(
        lambda: allocator.decref(block),
        rf"\b{block}\b",
        f"decref of block {block} at count 0 is a double free",
    )
    for foreign in (0, 4, -1, 99):
        why = f"decref({foreign}) names no block of this allocator (1..3): reject it (self._check)"
        expect_value_error(lambda foreign=foreign: allocator.decref(foreign), rf"{foreign}", why)


def test_a_rejected_double_free_changes_nothing(allocator_module):
    """The engine catches a double free and goes on (an aborted request freed twice): the ValueError must
    leave the block as it was, held at 0, so that it can still be released and handed out once."""
    allocator = allocator_module.BlockAllocator(3)
    block = allocator.allocate()
    allocator.decref(block)
    with pytest.raises(ValueError):
        allocator.decref(block)
    count = allocator.ref_counts[block]
    assert count == 0, (
        f"after a rejected double free block {block}'s reference count is {count}, not 0: check the count "
        "before you decrement it, so that a call that raises changes nothing"
    )
    allocator.release(block)
    assert sorted(allocator.free_blocks()) == [1, 2], "the block goes back to the free list once"


def test_decref_holds_a_block_until_it_is_released(allocator_module):
    allocator = allocator_module.BlockAllocator(3)
    block = allocator.allocate()
    allocator.incref(block)
    counts = [allocator.decref(block), allocator.decref(block)]
    assert counts == [1, 0], (
        f"two decrefs of a block with count 2 returned {counts}, expected the new counts [1, 0]"
    )
    assert block not in allocator.free_blocks(), "decref to 0 holds the block; only release() puts it back"
    allocator.release(block)
    assert block in allocator.free_blocks(), "release puts a held block back on the free list"
    with pytest.raises(ValueError, match="already free"):
        allocator.release(block)


@pytest.mark.parametrize("num_blocks", [2, 7])
def test_allocator_random_operations_keep_every_block_once(allocator_module, num_blocks):
    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.tuples(st.sampled_from(["allocate", "incref", "decref", "release"]), st.integers(0, 7)))
    )
    def run(operations):
        allocator = allocator_module.BlockAllocator(num_blocks)
        refs = [0] * num_blocks
        held: set[int] = set()
        for op, pick in operations:
            used = [b for b in range(1, num_blocks) if refs[b] > 0]
            if op == "allocate" and allocator.num_free:
                block = allocator.allocate()
                assert block != 0 and refs[block] == 0 and block not in held, (
                    f"allocate handed out block {block} twice"
                )
                refs[block] = 1
            elif op == "incref" and used:
                block = used[pick % len(used)]
                allocator.incref(block)
                refs[block] += 1
            elif op == "decref" and used:
                block = used[pick % len(used)]
                refs[block] -= 1
                count = allocator.decref(block)
                assert count == refs[block], (
                    f"decref({block}) returned {count}, expected its new count {refs[block]}"
                )
                if refs[block] == 0:
                    held.add(block)
            elif op == "release" and held:
                block = sorted(held)[pick % len(held)]
                allocator.release(block)
                held.discard(block)
            free = allocator.free_blocks()
            assert len(free) == len(set(free)), f"a block is on the free list twice: {free}"
            assert sorted(free + [b for b in range(1, num_blocks) if refs[b]] + sorted(held)) == list(
                range(1, num_blocks)
            ), "every block must be exactly one of: free, in use, held"
            assert allocator.ref_counts[1:] == refs[1:], (
                f"reference counts {allocator.ref_counts[1:]}, expected {refs[1:]} after {op}: "
                "decref subtracts one"
            )

    run()


# -------------------------------------------------------------- fork, copy-on-write, free


def test_fork_shares_blocks_and_the_first_write_copies_the_partial_block(manager_class):
    manager = manager_class(num_blocks=10, block_size=4, enable_prefix_caching=False)
    parent = FakeRequest("p", list(range(10)))
    assert manager.lookup_prefix(parent).num_tokens == 0
    assert manager.allocate_slots(parent, 10), "10 tokens, 9 blocks free: allocate_slots must succeed"
    parent.num_computed = 10
    child = FakeRequest("c", parent.token_ids, num_computed=10)
    manager.fork(parent, child)
    assert manager.block_table("c") == manager.block_table("p"), (
        "a forked child starts with its parent's table"
    )
    assert all(manager.allocator.ref_counts[b] == 2 for b in manager.block_table("p")), (
        "fork increfs every block"
    )
    used = manager.num_used_blocks
    # token 10 lands in block 2 (positions 8..11), shared
    assert manager.allocate_slots(child, 1), (
        "one token after a fork, 7 blocks free: allocate_slots must succeed"
    )
    child_table, parent_table = manager.block_table("c"), manager.block_table("p")
    assert child_table[:2] == parent_table[:2], "full blocks the child does not write stay shared"
    assert child_table[2] != parent_table[2], (
        "copy-on-write: the written block must be replaced by a fresh one"
    )
    assert manager.take_copies() == [(parent_table[2], child_table[2])], "queue (src, dst) for the runner"
    assert manager.take_copies() == [], "take_copies clears the queue"
    assert manager.num_used_blocks == used + 1, (
        f"{manager.num_used_blocks} blocks in use after one copy-on-write, expected {used + 1}: "
        "one fresh block"
    )
    assert manager.allocator.ref_counts[parent_table[2]] == 1, "the child dropped its reference to the source"


def test_write_at_a_block_boundary_after_fork_copies_nothing(manager_class):
    manager = manager_class(num_blocks=10, block_size=4, enable_prefix_caching=False)
    parent = FakeRequest("p", list(range(8)))
    manager.allocate_slots(parent, 8)
    parent.num_computed = 8
    child = FakeRequest("c", parent.token_ids, num_computed=8)
    manager.fork(parent, child)
    assert manager.allocate_slots(child, 1), (
        "one token after a fork, 7 blocks free: allocate_slots must succeed"
    )
    assert len(manager.block_table("c")) == 3 and manager.block_table("c")[:2] == manager.block_table("p"), (
        f"the child's table {manager.block_table('c')} after writing position 8: the parent's two full "
        "blocks, shared, then one new block"
    )
    assert manager.take_copies() == [], "a new block needs no copy: nothing of the child's is in it yet"


def test_forked_sequences_cache_their_own_blocks(manager_class):
    """Parallel sampling (n > 1) with prefix caching on, as the engine runs it: after a fork, parent and
    child grow different tokens, and each one's full blocks must be cached under its own chained keys."""
    manager = manager_class(num_blocks=12, block_size=4, enable_prefix_caching=True)
    parent = FakeRequest("p", list(range(6)))
    assert manager.allocate_slots(parent, 6, manager.lookup_prefix(parent))
    parent.num_computed = 6
    manager.cache_full_blocks(parent)
    child = FakeRequest("c", parent.token_ids, num_computed=6)
    manager.fork(parent, child)
    for request, tail in ((child, [100, 101]), (parent, [200, 201])):
        request.token_ids += tail
        assert manager.allocate_slots(request, 2), f"room for 2 more of {request.request_id}'s tokens"
        request.num_computed = 8
        manager.cache_full_blocks(request)
    for request in (parent, child):
        later = FakeRequest("later", [*request.token_ids, 9])
        found = manager.lookup_prefix(later).num_tokens
        assert found == 8, (
            f"a new request starting with {request.request_id}'s 8 tokens finds {found} of them cached, "
            "expected 8 (both of its full blocks). Likely: fork gave the child the parent's list of chained "
            "keys itself, not a copy (list(self._keys[parent])): the child's new key went into the "
            "parent's list, so the parent's second block looked cached already and was never registered"
        )


def test_free_returns_every_block_and_double_free_raises(manager_class):
    manager = manager_class(num_blocks=6, block_size=2, enable_prefix_caching=False)
    a, b = FakeRequest("a", [1, 2, 3]), FakeRequest("b", [4, 5, 6, 7])
    for r in (a, b):
        assert manager.allocate_slots(r, r.num_tokens), f"no room for {r.request_id}'s tokens"
        r.num_computed = r.num_tokens
    assert manager.num_free_blocks == 1 and manager.num_used_blocks == 4, (
        "3 + 4 tokens in blocks of 2: 4 blocks"
    )
    manager.free(a)
    manager.free(b)
    assert manager.num_free_blocks == 5 and manager.num_used_blocks == 0, "free must return every block"
    assert sorted(manager.allocator.free_blocks()) == [1, 2, 3, 4, 5], (
        f"free list {sorted(manager.allocator.free_blocks())} after freeing everything (prefix caching off): "
        "a block at count 0 that is not cached goes back to the allocator's free list (release)"
    )
    expect_value_error(lambda: manager.free(a), "'a'", "freeing request 'a' a second time")


def test_allocate_slots_is_all_or_nothing(manager_class):
    manager = manager_class(num_blocks=5, block_size=4, enable_prefix_caching=False)
    a = FakeRequest("a", list(range(9)))
    assert manager.allocate_slots(a, 9) and len(manager.block_table("a")) == 3
    b = FakeRequest("b", list(range(8)))
    assert not manager.allocate_slots(b, 8), "2 blocks wanted, 1 free: must refuse"
    assert not manager.holds("b") and manager.num_free_blocks == 1, "a refusal must change nothing"
    assert manager.allocate_slots(b, 4) and len(manager.block_table("b")) == 1, (
        "1 block wanted, 1 free: must succeed"
    )


def test_copy_on_write_counts_toward_all_or_nothing(manager_class):
    manager = manager_class(num_blocks=4, block_size=4, enable_prefix_caching=False)
    parent = FakeRequest("p", list(range(6)))
    manager.allocate_slots(parent, 6)
    parent.num_computed = 6
    child = FakeRequest("c", parent.token_ids, num_computed=6)
    manager.fork(parent, child)
    # one free block: the child's 3 new tokens need a copy of block 1 and one more block after it
    assert not manager.allocate_slots(child, 3), "copy-on-write needs a fresh block too: 2 wanted, 1 free"
    assert manager.block_table("c") == manager.block_table("p") and manager.take_copies() == [], (
        "a refused allocate_slots must leave the table and the copy queue as they were (all or nothing)"
    )
    assert manager.allocate_slots(child, 2), "2 tokens fit in the copied block: 1 fresh block wanted, 1 free"


def test_slot_mapping_is_block_times_block_size_plus_offset(manager_class):
    manager = manager_class(num_blocks=8, block_size=4, enable_prefix_caching=False)
    a = FakeRequest("a", list(range(6)))
    manager.allocate_slots(a, 6)
    table = manager.block_table("a")
    assert manager.slot_mapping("a", 0, 6) == [table[p // 4] * 4 + p % 4 for p in range(6)], (
        "position p's slot is table[p // block_size] * block_size + p % block_size"
    )
    with pytest.raises(ValueError, match="outside"):
        manager.slot_mapping("a", 0, 9)


# -------------------------------------------------------------- random sequences against a model of KV memory

VOCAB = st.integers(0, 3)  # a tiny vocabulary: forks diverge often, but prompts share prefixes too
STEMS = [[], [7, 7, 1, 2, 3, 4, 5, 6], [7, 7, 1, 2, 9, 9, 9, 9, 9, 9]]


def manager_machine(manager_class):
    class ManagerMachine(RuleBasedStateMachine):
        @initialize(
            num_blocks=st.integers(2, 16), block_size=st.sampled_from([1, 2, 4]), prefix_caching=st.booleans()
        )
        def setup(self, num_blocks, block_size, prefix_caching):
            self.manager = manager_class(num_blocks, block_size, enable_prefix_caching=prefix_caching)
            self.block_size = block_size
            self.live: dict[str, FakeRequest] = {}
            self.memory: dict[int, int] = {}  # cache row -> the token whose K/V was written there
            self.count = 0

        # -------------------------------------------------------- helpers

        def _new_id(self) -> str:
            self.count += 1
            return f"r{self.count}"

        def _snapshot(self):
            m = self.manager
            return (
                m.block_tables(),
                list(m.allocator.ref_counts),
                m.allocator.free_blocks(),
                m.prefix_cache.evictable_blocks(),
                m.num_free_blocks,
            )

        def _run(self, request: FakeRequest, num_new: int, prefix=None) -> bool:
            """Allocate slots for ``num_new`` tokens (a new request: after its cached ``prefix``), apply the
            queued copies, write the tokens: one step. False if the manager refused."""
            before = self._snapshot()
            if not self.manager.allocate_slots(request, num_new, prefix):
                assert self._snapshot() == before, "allocate_slots returned False but changed the cache state"
                return False
            if prefix is not None:
                request.num_computed = prefix.num_tokens
            bs = self.block_size
            for src, dst in self.manager.take_copies():
                for offset in range(bs):
                    value = self.memory.get(src * bs + offset)
                    if value is None:
                        self.memory.pop(dst * bs + offset, None)
                    else:
                        self.memory[dst * bs + offset] = value
            table = self.manager.block_table(request.request_id)
            tables = self.manager.block_tables()
            start = request.num_computed
            assert len(table) * bs >= start + num_new, (
                "allocate_slots returned True but the table is too short"
            )
            for position in range(start, start + num_new):
                block = table[position // bs]
                assert block != 0, "the null block was handed to a request"
                sharers = [rid for rid, t in tables.items() if block in t and rid != request.request_id]
                assert not sharers, (
                    f"{request.request_id} writes position {position} into block {block}, still listed by "
                    f"{sharers}: copy-on-write must replace a shared block before it is written"
                )
                assert not self.manager.prefix_cache.is_cached(block), (
                    f"block {block} is written while registered in the prefix cache: its key would lie"
                )
                self.memory[block * bs + position % bs] = request.token_ids[position]
            request.num_computed = start + num_new
            self.manager.cache_full_blocks(request)
            return True

        def _pick(self, data, condition):
            ids = sorted(rid for rid, r in self.live.items() if condition(r))
            return self.live[data.draw(st.sampled_from(ids))] if ids else None

        # -------------------------------------------------------- rules

        @rule(stem=st.sampled_from(STEMS), tail=st.lists(VOCAB, max_size=9), chunk=st.integers(1, 12))
        def admit(self, stem, tail, chunk):
            tokens = stem + tail or [0]
            request = FakeRequest(self._new_id(), tokens)
            before = self._snapshot()
            prefix = self.manager.lookup_prefix(request)
            assert self._snapshot() == before, "lookup_prefix changed the cache state: a look-up only reads"
            hit = prefix.num_tokens
            assert hit % self.block_size == 0, (
                f"lookup_prefix found {hit} tokens, not a whole number of blocks"
            )
            assert hit <= request.num_tokens - 1, (
                f"lookup_prefix found {hit} of {request.num_tokens} tokens: leave at least one to compute"
            )
            if self._run(request, min(chunk, request.num_tokens - hit), prefix):
                self.live[request.request_id] = request

        @precondition(lambda self: any(r.num_computed < r.num_tokens for r in self.live.values()))
        @rule(data=st.data(), chunk=st.integers(1, 12))
        def prefill(self, data, chunk):
            request = self._pick(data, lambda r: r.num_computed < r.num_tokens)
            self._run(request, min(chunk, request.num_tokens - request.num_computed))

        @precondition(lambda self: any(r.num_computed == r.num_tokens for r in self.live.values()))
        @rule(data=st.data(), tokens=st.lists(VOCAB, min_size=1, max_size=3))
        def decode(self, data, tokens):
            """Append one token, or verify a few at once (speculative decoding's step)."""
            request = self._pick(data, lambda r: r.num_computed == r.num_tokens)
            request.token_ids += tokens
            self._run(request, len(tokens))

        @precondition(lambda self: any(r.num_computed == r.num_tokens for r in self.live.values()))
        @rule(data=st.data())
        def fork(self, data):
            parent = self._pick(data, lambda r: r.num_computed == r.num_tokens)
            child = FakeRequest(self._new_id(), parent.token_ids, parent.num_computed)
            self.manager.fork(parent, child)
            self.live[child.request_id] = child

        @precondition(lambda self: any(r.num_computed > 1 for r in self.live.values()))
        @rule(data=st.data(), drop=st.integers(1, 6))
        def truncate(self, data, drop):
            """Roll back rejected draft tokens."""
            request = self._pick(data, lambda r: r.num_computed > 1)
            keep = max(1, request.num_computed - drop)
            request.token_ids = request.token_ids[:keep]
            request.num_computed = keep
            self.manager.truncate(request, keep)
            assert len(self.manager.block_table(request.request_id)) == -(-keep // self.block_size), (
                "truncate must keep exactly the blocks that hold the first num_tokens tokens"
            )

        @precondition(lambda self: self.live)
        @rule(data=st.data())
        def free(self, data):
            request = self._pick(data, lambda r: True)
            self.manager.free(request)
            del self.live[request.request_id]
            with pytest.raises(ValueError):
                self.manager.free(request)

        # -------------------------------------------------------- invariants

        @invariant()
        def every_block_accounted_once_with_exact_reference_counts(self):
            if not hasattr(self, "manager"):
                return
            m = self.manager
            tables = m.block_tables()
            assert sorted(tables) == sorted(self.live), (
                "the manager's live requests differ from those not freed"
            )
            listed = collections.Counter(b for t in tables.values() for b in t)
            assert 0 not in listed, "block 0 is the null block: it must never appear in a block table"
            free, evictable = m.allocator.free_blocks(), m.prefix_cache.evictable_blocks()
            cached_but_free = [b for b in free if m.prefix_cache.is_cached(b)]
            assert not cached_but_free, (
                f"blocks {cached_but_free} are on the free list but still in the prefix cache: a "
                "cached block whose count reaches 0 waits on the LRU (prefix_cache.park) and is "
                "forgotten only when evicted"
            )
            in_use = sorted(listed)
            everything = sorted(free + evictable + in_use)
            assert everything == list(range(1, m.num_blocks)), (
                f"every block must be exactly once free {sorted(free)}, evictable {sorted(evictable)} "
                f"or in use {in_use}: a block was lost or is in two places"
            )
            for block in range(1, m.num_blocks):
                assert m.allocator.ref_counts[block] == listed[block], (
                    f"block {block} has reference count {m.allocator.ref_counts[block]} "
                    f"but {listed[block]} tables list it"
                )
            assert m.num_used_blocks == len(in_use) and m.num_free_blocks == len(free) + len(evictable), (
                "num_used_blocks / num_free_blocks disagree with the blocks listed, free and evictable"
            )

        @invariant()
        def every_request_reads_its_own_tokens(self):
            if not hasattr(self, "manager"):
                return
            bs = self.block_size
            for request in self.live.values():
                table = self.manager.block_table(request.request_id)
                for position in range(request.num_computed):
                    row = table[position // bs] * bs + position % bs
                    assert self.memory.get(row) == request.token_ids[position], (
                        f"{request.request_id} reads {self.memory.get(row)} at position {position} "
                        f"(block {table[position // bs]}) instead of {request.token_ids[position]}: a "
                        "block it uses was overwritten (shared without copy-on-write, evicted while in "
                        "use, or a wrong prefix hit)"
                    )

    return ManagerMachine


def test_random_allocate_fork_append_truncate_free_sequences(manager_class):
    run_state_machine_as_test(
        manager_machine(manager_class),
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
