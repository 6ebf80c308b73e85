"""The block allocator: which KV blocks are free, and how many block tables point at each of the others.

KV memory is cut into ``num_blocks`` fixed-size blocks of ``block_size`` token rows. A request's
*block table* lists the blocks that hold its tokens in order; token ``p`` lives in block
``table[p // block_size]`` at offset ``p % block_size``. Blocks are shared by reference count: a
forked sequence (parallel sampling, ``n > 1``) or a prefix-cache hit points at the same block as
another request instead of copying it::

    block id:    0     1     2     3     4     5     6     7
    ref count:  [-]   [2]   [1]   [0]   [1]   [0]   [0]   [0]
                null   |     |           |
    request A:  [1, 2]-+     |           |      free list: 3 5 6 7  (handed out from the left)
    request B:  [1, 4]-------------------+      block 1 is shared: A and B hold the same prompt block

Every block is in exactly one state, and the allocator never loses or duplicates one:

* block 0, the **null block**: reserved, never handed out (padding slots write there);
* **free**: on the free list, reference count 0;
* **in use**: reference count >= 1, on no list;
* **held**: reference count 0 but off the free list, because its owner (the prefix cache) keeps its
  contents for reuse; the owner either revives it (``incref``) or gives it back (``release``).

``decref`` does not put a block back on the free list by itself: the caller decides whether a block
whose count reached 0 is released or held, which is what lets a prefix cache keep finished blocks.
"""

from __future__ import annotations

from collections import deque

NULL_BLOCK = 0


class BlockAllocator:
    """Free list and reference counts for blocks ``1 .. num_blocks - 1`` (block 0 is the null block)."""

    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the reserved null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._is_free = [False] + [True] * (num_blocks - 1)

    @property
    def num_free(self) -> int:
        """Blocks on the free list (held blocks are not counted)."""
        return len(self._free)

    def free_blocks(self) -> list[int]:
        """The free list, next block to be handed out first."""
        return list(self._free)

    def is_free(self, block: int) -> bool:
        self._check(block)
        return self._is_free[block]

    def allocate(self) -> int:
        """Take the next block off the free list; it leaves with reference count 1."""
        if not self._free:
            raise RuntimeError("no free KV block: check num_free (or evict a cached block) before allocating")
        block = self._free.popleft()
        self._is_free[block] = False
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        """One more block table points at ``block`` (in use, or held and now revived)."""
        self._check(block)
        if self._is_free[block]:
            raise ValueError(f"block {block} is on the free list: allocate it, do not incref it")
        self.ref_counts[block] += 1

    def decref(self, block: int) -> int:
        """One block table lets go of ``block``; returns its new reference count.

        At 0 the block is *held*: the caller must ``release`` it or keep it (the prefix cache does).
        Raises ValueError naming the block if it is not in use (a double free) or not ours.
        """
        # BEGIN SOLUTION Lab 2: reject a foreign block (self._check) and one whose count is already 0
        #  (double free: ValueError naming the block); then decrement and return the new count
        # HINT: A reference count says how many block tables list the block. Freeing a block twice, or a
        #  block that is not ours, would later hand one block to two sequences and corrupt their K/V:
        #  fail at once, naming the block.
        # HINT: Three steps: self._check(block) rejects the null block and ids out of range; a count already
        #  at 0 is a double free (ValueError with the block's number in it); otherwise subtract one and
        #  return the new count.
        # HINT: Reaching 0 frees nothing here: the caller decides (release() puts the block on the free list,
        #  the prefix cache may keep it). decref only counts.
        self._check(block)
        if self.ref_counts[block] == 0:
            raise ValueError(f"double free of block {block}: its reference count is already 0")
        self.ref_counts[block] -= 1
        return self.ref_counts[block]
        # END SOLUTION

    def release(self, block: int) -> None:
        """Put a held block (reference count 0, off the free list) back on the free list."""
        self._check(block)
        if self.ref_counts[block] != 0 or self._is_free[block]:
            state = (
                "already free"
                if self._is_free[block]
                else f"in use (reference count {self.ref_counts[block]})"
            )
            raise ValueError(f"cannot release block {block}: it is {state}")
        self._free.append(block)
        self._is_free[block] = True

    def _check(self, block: int) -> None:
        if not isinstance(block, int) or isinstance(block, bool):
            raise ValueError(f"block ids are ints, got {block!r}")
        if block == NULL_BLOCK:
            raise ValueError(
                f"block {NULL_BLOCK} is the reserved null block: it is never allocated, shared or freed"
            )
        if not 0 < block < self.num_blocks:
            raise ValueError(f"block {block} is not one of this allocator's blocks 1..{self.num_blocks - 1}")
