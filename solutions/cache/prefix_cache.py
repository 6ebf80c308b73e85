"""Automatic prefix caching: full KV blocks found again by a chained hash of the tokens they hold.

A full block's key is ``hash(parent block's key, this block's token ids)``, as in vLLM's automatic
prefix caching. Chaining makes a key stand for the *whole prefix* up to the end of its block, not
just the block's own tokens: the same 16 tokens after two different prompts have different K/V
(attention saw different pasts), and they get different keys::

    tokens:  | t0 .. t15 | t16 .. t31 | t32 .. t40 (partial: never hashed)
    keys:      h0 = H(root, t0..15)    h1 = H(h0, t16..31)
    another request that differs only at t20 shares h0, and diverges from h1 on.

The cache maps key -> block for blocks that a request has fully computed. When the last request
using a cached block lets go (reference count 0), the block keeps its contents and joins an LRU
list of *evictable* blocks instead of the free list; a later request with the same prefix revives
it. Only when the free list is empty is the least recently freed cached block evicted: its key is
forgotten and the block is handed out for new tokens.

Invariants: ``hash_to_block`` and ``block_to_hash`` are inverse maps; every evictable block is
cached and has reference count 0 (the allocator's "held" state); one key names at most one block,
so a newly computed block whose key is already cached stays uncached.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

BlockHash = bytes
ROOT_HASH: BlockHash = b"fastmode-prefix-root"


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """The chained key of one full block: SHA-256 of the parent's key and this block's token ids.

    A cryptographic hash, as vLLM's default, so two different prefixes never share a block by collision.
    """
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def chain_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    start: int = 0,
    parent: BlockHash = ROOT_HASH,
    stop: int | None = None,
) -> list[BlockHash]:
    """Keys of full blocks ``start, start + 1, ...`` of ``token_ids``
    (block ``start - 1`` has key ``parent``).

    Stops before block ``stop`` if given, and at the last full block; a partial block has no key.
    """
    num_full = len(token_ids) // block_size if stop is None else min(stop, len(token_ids) // block_size)
    keys = []
    for index in range(start, num_full):
        parent = hash_block_tokens(parent, token_ids[index * block_size : (index + 1) * block_size])
        keys.append(parent)
    return keys


class PrefixCache:
    """key -> block for full computed blocks, and the LRU of cached blocks no request holds."""

    def __init__(self) -> None:
        self.hash_to_block: dict[BlockHash, int] = {}
        self.block_to_hash: dict[int, BlockHash] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first

    @property
    def num_cached(self) -> int:
        return len(self.hash_to_block)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def evictable_blocks(self) -> list[int]:
        """Cached blocks with reference count 0, the next to be evicted first."""
        return list(self._evictable)

    def lookup(self, key: BlockHash) -> int | None:
        return self.hash_to_block.get(key)

    def is_cached(self, block: int) -> bool:
        return block in self.block_to_hash

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def insert(self, key: BlockHash, block: int) -> bool:
        """Register ``block`` under ``key``; False (and nothing changes) if either is already cached."""
        if key in self.hash_to_block or block in self.block_to_hash:
            return False
        self.hash_to_block[key] = block
        self.block_to_hash[block] = key
        return True

    def park(self, block: int) -> None:
        """``block`` (cached) lost its last reference: it becomes the newest evictable block."""
        if block not in self.block_to_hash:
            raise ValueError(f"block {block} is not cached: only cached blocks can wait in the LRU")
        if block in self._evictable:
            raise ValueError(f"block {block} is already evictable (freed twice?)")
        self._evictable[block] = None

    def unpark(self, block: int) -> None:
        """A request reuses evictable ``block``: it leaves the LRU."""
        if block not in self._evictable:
            raise ValueError(f"block {block} is not evictable")
        del self._evictable[block]

    def evict(self) -> int:
        """Forget the least recently freed cached block and return it (its contents are now garbage)."""
        if not self._evictable:
            raise RuntimeError("no evictable cached block")
        block, _ = self._evictable.popitem(last=False)
        self.uncache(block)
        return block

    def uncache(self, block: int) -> None:
        """Forget ``block``'s key (it is about to be overwritten); it must not be evictable."""
        if block in self._evictable:
            raise ValueError(f"block {block} is evictable: evict it instead")
        key = self.block_to_hash.pop(block)
        del self.hash_to_block[key]
