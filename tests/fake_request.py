"""A stand-in for the engine's Request in the cache tests: only what the KV-cache manager may read."""

from __future__ import annotations


class FakeRequest:
    """The four attributes the manager may read, and nothing else."""

    def __init__(self, request_id: str, token_ids: list[int], num_computed: int = 0):
        self.request_id, self.token_ids, self.num_computed = request_id, list(token_ids), num_computed

    @property
    def all_token_ids(self) -> list[int]:
        return list(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
