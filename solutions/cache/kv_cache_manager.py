"""The KV-cache manager: each request's block table, built from the allocator and the prefix cache.

The scheduler looks a waiting request's prompt up in the prefix cache (``lookup_prefix``, which changes
nothing) and asks for room (``allocate_slots``, which takes the cached prefix's blocks and any fresh ones, all
or nothing) before a step; the runner reads block tables to build slot mappings; finished requests give their
blocks back (``free``). It never touches tensors: the copy-on-write copies it decides are queued as
``(src, dst)`` block pairs for the runner. It reads only these request attributes: ``request_id``,
``all_token_ids``, ``num_tokens``, ``num_computed`` (``CacheRequest``).

    request A (40 tokens, block_size 16):  table [7, 3, 9]
        positions  0..15 -> block 7    rows  7*16 ..  7*16+15
        positions 16..31 -> block 3    rows  3*16 ..  3*16+15
        positions 32..39 -> block 9    rows  9*16 ..  9*16+7   (8 rows of block 9 still empty)
    slot (row) of position p = table[p // block_size] * block_size + p % block_size   (kernels/blocks.py)

Invariants, after every public call:

* every block but the null block 0 is in exactly one place: the allocator's free list, the prefix
  cache's evictable LRU (reference count 0, contents kept), or in use;
* a block's reference count is the number of block tables that list it;
* tokens ``[0, request.num_computed)`` of a request are in its table's blocks;
* a block that new tokens are written into is listed by one table only (copy-on-write) and is not
  in the prefix cache (its key would no longer describe its contents).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..kernels.blocks import cache_slots, cdiv
from .block_allocator import BlockAllocator
from .prefix_cache import ROOT_HASH, BlockHash, PrefixCache, chain_block_hashes


class CacheRequest(Protocol):
    """What the manager reads of a request (the engine's ``Request``; the tests' ``FakeRequest``)."""

    @property
    def request_id(self) -> str: ...

    @property
    def all_token_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...

    num_computed: int


@dataclass(frozen=True)
class CachedPrefix:
    """The cached full blocks that start a request's tokens, found by ``lookup_prefix`` and not yet taken:
    ``blocks[i]`` holds tokens ``[i * block_size, (i + 1) * block_size)`` under chained key ``keys[i]``.
    Valid until the cache next changes (the scheduler passes it to ``allocate_slots`` in the same step)."""

    blocks: tuple[int, ...]
    keys: tuple[BlockHash, ...]
    num_tokens: int


NO_PREFIX = CachedPrefix((), (), 0)


class KVCacheManager:
    """Paged KV memory of ``num_blocks`` blocks of ``block_size`` tokens (block 0 reserved as null)."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.allocator = BlockAllocator(num_blocks)
        self.prefix_cache = PrefixCache()
        self._tables: dict[str, list[int]] = {}
        self._keys: dict[str, list[BlockHash]] = {}  # chained keys of each request's first full blocks
        self._copies: list[tuple[int, int]] = []
        self._changed: set[str] = set()  # requests whose table changed since take_changed_tables
        # prefix-cache statistics, over every admission (allocate_slots with a prefix)
        self.num_queried_tokens = 0
        self.num_hit_tokens = 0

    # ------------------------------------------------------------------ how much room there is

    @property
    def num_free_blocks(self) -> int:
        """Blocks ``allocate_slots`` could hand out now: free ones plus evictable cached ones."""
        return self.allocator.num_free + self.prefix_cache.num_evictable

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one live request."""
        return self.num_blocks - 1 - self.num_free_blocks

    def block_table(self, request_id: str) -> list[int]:
        """A copy of the request's block table (block ids, in token order)."""
        return list(self._table(request_id))

    def block_table_view(self, request_id: str) -> list[int]:
        """The request's live block table, not a copy: read it, never change it (the runner's persistent batch
        copies a table only when a plan's ``block_tables``, filled from ``take_changed_tables``, names it)."""
        return self._table(request_id)

    def holds(self, request_id: str) -> bool:
        """Whether the request holds a block table (it was admitted and not freed since)."""
        return request_id in self._tables

    def take_changed_tables(self) -> set[str]:
        """The ids of requests whose table was created, changed or freed since
        the last call (then cleared)."""
        changed, self._changed = self._changed, set()
        return changed

    def block_tables(self) -> dict[str, list[int]]:
        """Every live request's block table (copies), for inspection."""
        return {request_id: list(table) for request_id, table in self._tables.items()}

    def slot_mapping(self, request_id: str, start: int, end: int) -> list[int]:
        """Cache rows of positions ``[start, end)``:
        ``table[p // block_size] * block_size + p % block_size``."""
        table, size = self._table(request_id), self.block_size
        if not 0 <= start <= end <= len(table) * size:
            raise ValueError(
                f"positions [{start}, {end}) are outside request {request_id!r}'s {len(table)} blocks "
                f"({len(table) * size} slots)"
            )
        return cache_slots(np.array(table), np.arange(start, end), size).tolist()

    # ------------------------------------------------------------------ the request life cycle

    def lookup_prefix(self, request: CacheRequest) -> CachedPrefix:
        """The longest cached run of full blocks that starts ``request``'s tokens. Changes nothing: the blocks
        are taken by ``allocate_slots(request, n, prefix)`` when the request is admitted.

        At most ``num_tokens - 1`` tokens are found, so at least one is left to compute (the step needs a
        query to produce the next token's logits). Without prefix caching, or for a request asking for prompt
        logprobs (each prompt position's logits must be computed), the prefix is empty.
        """
        params = getattr(request, "params", None)
        if not self.enable_prefix_caching or getattr(params, "prompt_logprobs", None) is not None:
            return NO_PREFIX
        size = self.block_size
        keys = chain_block_hashes(request.all_token_ids, size, stop=(request.num_tokens - 1) // size)
        blocks = []
        for key in keys:
            block = self.prefix_cache.lookup(key)
            if block is None:
                break
            blocks.append(block)
        return CachedPrefix(tuple(blocks), tuple(keys[: len(blocks)]), len(blocks) * size)

    def allocate_slots(
        self, request: CacheRequest, num_new_tokens: int, prefix: CachedPrefix | None = None
    ) -> bool:
        """Make room for ``num_new_tokens`` more of ``request``'s tokens; False, changing nothing, if
        blocks run short.

        A request that holds blocks writes the new tokens' K/V at positions
        ``[num_computed, num_computed + num_new_tokens)``. A request's first call (its admission:
        ``num_computed`` still 0) acquires the blocks of ``prefix`` (``lookup_prefix``'s, or None), one
        reference each, and the new tokens follow them:
        positions ``[prefix.num_tokens, prefix.num_tokens + num_new_tokens)``; the caller then sets
        ``num_computed = prefix.num_tokens``. Any block the new tokens land in that another table also
        lists is replaced by a fresh block first (copy-on-write; the pair ``(src, dst)`` is queued
        for ``take_copies`` when ``src`` holds computed tokens of this request). All or nothing:
        if the fresh blocks needed exceed the free ones (cached blocks the prefix revives no longer
        count as free), nothing changes.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        request_id, size = request.request_id, self.block_size
        table = self._tables.get(request_id)
        if table is None:
            return self._admit(request, num_new_tokens, prefix or NO_PREFIX)
        if prefix is not None:
            raise ValueError(
                f"request {request_id!r} already holds blocks: a cached prefix is acquired by its first "
                "allocate_slots only"
            )
        start, end = request.num_computed, request.num_computed + num_new_tokens
        if start > len(table) * size:
            raise ValueError(
                f"request {request_id!r} has {start} computed tokens but its table covers only "
                f"{len(table) * size}"
            )
        written = range(start // size, min(len(table), cdiv(end, size))) if num_new_tokens else range(0)
        shared = [index for index in written if self.allocator.ref_counts[table[index]] > 1]
        num_appended = max(0, cdiv(end, size) - len(table))
        needed = num_appended + len(shared)
        if needed > self.num_free_blocks:
            return False
        for index in shared:
            self._copy_on_write(table, index, start)
        for index in written:
            if self.prefix_cache.is_cached(table[index]):  # ours alone now, and about to change
                self.prefix_cache.uncache(table[index])
        if needed:
            table.extend(self._take_free_block() for _ in range(num_appended))
            self._changed.add(request_id)
        return True

    def _admit(self, request: CacheRequest, num_new_tokens: int, prefix: CachedPrefix) -> bool:
        """A request's first blocks: ``prefix``'s, acquired, then fresh ones for ``num_new_tokens``; all or
        nothing. The prefix's blocks are full and come before the new tokens, so none of them is written."""
        if request.num_computed:
            raise ValueError(
                f"request {request.request_id!r} holds no blocks but counts {request.num_computed} computed "
                "tokens: set num_computed = prefix.num_tokens after allocate_slots admits it, 0 until then"
            )
        num_fresh = cdiv(prefix.num_tokens + num_new_tokens, self.block_size) - len(prefix.blocks)
        revived = sum(self.prefix_cache.is_evictable(block) for block in prefix.blocks)
        if num_fresh > self.num_free_blocks - revived:
            return False
        for block in prefix.blocks:
            if self.prefix_cache.is_evictable(block):
                self.prefix_cache.unpark(block)
            self.allocator.incref(block)
        table = list(prefix.blocks)
        table.extend(self._take_free_block() for _ in range(num_fresh))
        self._tables[request.request_id], self._keys[request.request_id] = table, list(prefix.keys)
        self._changed.add(request.request_id)
        if self.enable_prefix_caching:
            self.num_queried_tokens += request.num_tokens
            self.num_hit_tokens += prefix.num_tokens
        return True

    def cache_full_blocks(self, request: CacheRequest) -> None:
        """Register each block fully covered by ``request.num_computed`` tokens whose ids the request holds
        (overlap scheduling computes a token before the host reads its id) under its chained key.

        Idempotent. A block whose key is already cached (another request computed the same prefix
        at the same time) stays uncached and returns to the free list when freed.
        """
        if not self.enable_prefix_caching:
            return
        table, keys = self._table(request.request_id), self._keys[request.request_id]
        num_full = min(min(request.num_computed, request.num_tokens) // self.block_size, len(table))
        if len(keys) >= num_full:
            return
        parent = keys[-1] if keys else ROOT_HASH
        for index, key in enumerate(
            chain_block_hashes(request.all_token_ids, self.block_size, len(keys), parent, num_full), len(keys)
        ):
            keys.append(key)
            if not self.prefix_cache.is_cached(table[index]):
                self.prefix_cache.insert(key, table[index])

    def fork(self, parent: CacheRequest, child: CacheRequest) -> None:
        """``child`` starts with ``parent``'s blocks, shared (parallel sampling, ``n > 1``).

        Both tables list the same blocks, each reference count one higher; the first write into a
        shared block copies it (``allocate_slots``).
        """
        if child.request_id in self._tables:
            raise ValueError(f"request {child.request_id!r} already holds blocks: fork into a new request")
        parent_table = self._table(parent.request_id)
        # BEGIN SOLUTION Lab 2: incref every block of the parent's table, give the child a copy of that table
        #  (self._tables) and of the parent's chained keys (self._keys)
        # HINT: A fork shares, it does not copy: the child's table lists the very same blocks, each one
        #  reference higher, so neither sequence's free() can return a block the other still reads.
        # HINT: incref each block of parent_table; store a list of the same blocks as the child's table in
        #  self._tables; give the child the parent's chained block keys in self._keys (its full blocks
        #  are the parent's).
        # HINT: Store copies (list(parent_table)), not the parent's lists themselves: a shared list object
        #  would make the child's new blocks appear in the parent's table too.
        for block in parent_table:
            self.allocator.incref(block)
        self._tables[child.request_id] = list(parent_table)
        self._keys[child.request_id] = list(self._keys[parent.request_id])
        # END SOLUTION
        self._changed.add(child.request_id)

    def truncate(self, request: CacheRequest, num_tokens: int) -> None:
        """Keep only the blocks that hold the first ``num_tokens`` tokens
        (rejected draft tokens roll back)."""
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        table = self._table(request.request_id)
        keep = cdiv(num_tokens, self.block_size)
        if len(table) > keep:
            self._changed.add(request.request_id)
        while len(table) > keep:
            self._release(table.pop())
        del self._keys[request.request_id][num_tokens // self.block_size :]

    def free(self, request: CacheRequest) -> None:
        """Give back every block of ``request``; raises ValueError if it holds none (a double free).

        Its full computed blocks are registered first (``cache_full_blocks``), so a request that
        finishes in the step that computed its prompt, or is preempted, still leaves its prefix
        cached. Blocks go back last first, so a cached prompt's tail is evicted before its head (the
        head is what other requests are most likely to share).
        """
        if request.request_id not in self._tables:
            raise ValueError(
                f"request {request.request_id!r} holds no blocks: freed twice, or never allocated"
            )
        self.cache_full_blocks(request)
        table = self._tables.pop(request.request_id)
        del self._keys[request.request_id]
        self._changed.add(request.request_id)
        for block in reversed(table):
            self._release(block)

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write ``(src, dst)`` block pairs queued since the last call (then cleared)."""
        copies, self._copies = self._copies, []
        return copies

    def prefix_cache_hit_rate(self) -> float:
        """Share of the admitted requests' tokens that were found in the prefix cache."""
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    # ------------------------------------------------------------------ blocks in and out

    def _table(self, request_id: str) -> list[int]:
        try:
            return self._tables[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} holds no blocks") from None

    def _take_free_block(self) -> int:
        """A fresh block: from the free list, or, when that is empty,
        the least recently freed cached block."""
        if self.allocator.num_free == 0:
            self.allocator.release(self.prefix_cache.evict())
        return self.allocator.allocate()

    def _copy_on_write(self, table: list[int], index: int, num_computed: int) -> None:
        """Replace shared ``table[index]`` with a fresh block, queueing a copy if it holds computed tokens."""
        # BEGIN SOLUTION Lab 2: take a fresh block (self._take_free_block); if the shared
        #  block holds computed tokens (index * block_size < num_computed) queue (src, dst) in self._copies;
        #  drop one reference to src; put the fresh block in table[index]
        # HINT: A block that several tables list must not be written in place: the writer gets its own copy.
        #  Only rows that already hold computed tokens need copying; a block none of whose rows are
        #  computed yet needs no copy.
        # HINT: Take a fresh block with self._take_free_block(); if index * block_size < num_computed, queue
        #  (src, dst) on self._copies for the runner; drop the writer's reference to src; put the fresh
        #  block at table[index].
        # HINT: Drop the reference with self.allocator.decref(src), not self._release(src): other tables
        #  still list src, so its count stays >= 1 and there is nothing to free or park.
        src, dst = table[index], self._take_free_block()
        if index * self.block_size < num_computed:
            self._copies.append((src, dst))
        self.allocator.decref(src)  # others still hold src: its count stays >= 1
        table[index] = dst
        # END SOLUTION

    def _release(self, block: int) -> None:
        """Drop one reference to ``block``; at 0 a cached block waits in the LRU, any other is free again."""
        # BEGIN SOLUTION Lab 2: decref; when the count reaches 0, a cached block (self.prefix_cache.is_cached)
        #  is parked in the LRU, any other is released to the allocator's free list
        # HINT: At count 0 a block may still be worth keeping: if the prefix cache knows its contents, a
        #  later request with the same prefix can reuse it. Such a block waits on the LRU; any other
        #  block is simply free again.
        # HINT: self.allocator.decref(block) returns the new count; at 0, self.prefix_cache.is_cached(block)
        #  chooses between self.prefix_cache.park(block) and self.allocator.release(block); above 0
        #  nothing else happens.
        # HINT: Park, never release, a cached block: released, it would stay registered in the prefix cache,
        #  and the next hit would hand out a block that a new sequence is already writing.
        if self.allocator.decref(block) == 0:
            if self.prefix_cache.is_cached(block):
                self.prefix_cache.park(block)
            else:
                self.allocator.release(block)
        # END SOLUTION
