"""Each running request's sampling settings in device buffers kept across steps, and the per-step gather that
turns them into the rows a step samples (vLLM's ``InputBatch`` sampling tensors; nano-vllm's temperatures).

A request's settings are written once, into its row, the first time it is sampled; a step then sends only
which row each sampled row reads and the counter of its seeded draw, in one non-blocking copy::

    settings (device)  floats [rows, 4]  temperature (1 when greedy), top_p, min_p, greedy (0 / 1)
                       ints   [rows, 3]  top_k (0: no limit), seed (+ the completion's index), seeded (0 / 1)
    step (host -> device, packed int64)  settings row | counter | ...   one entry per sampled row

What the host knows of the settings (their numpy twins) decides which filters run at all; nothing reads the
device. Invariant: a row's settings are those of ``owner[row]``; a row is reused only once its owner finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels.sampling import ACCEPT_STREAM, RowSettings, clamp_top_k, counter_uniforms
from .input_batch import StagingBuffer
from .request import Request

_FLOATS, _INTS = 4, 3


@dataclass(frozen=True)
class SampledRows:
    """What one token per row is drawn with: ``logits_index`` ``[N]`` (the rows of the step's logits),
    ``settings`` and one uniform number per row (float64 ``[N]``)."""

    logits_index: torch.Tensor
    settings: RowSettings
    uniform: torch.Tensor


@dataclass(frozen=True)
class ChainRows:
    """What ``rejection.verify`` needs for ``B`` chains of at most ``K`` drafts, on the device: the logits
    rows ``[B * (K + 1)]`` (a short chain repeats its last row), their settings, ``drafts`` ``[B, K]`` (0 past
    a chain's end), ``num_drafts`` ``[B]``, the acceptance numbers ``[B, K]`` and the draw numbers
    ``[B, K + 1]`` (float64)."""

    logits_index: torch.Tensor
    settings: RowSettings
    drafts: torch.Tensor
    num_drafts: torch.Tensor
    accept_uniform: torch.Tensor
    draw_uniform: torch.Tensor


class SamplingBatch:
    def __init__(self, vocab_size: int, device: torch.device, rows: int = 64):
        self.vocab_size, self.device = vocab_size, device
        self.owner: list[Request | None] = []
        self.row_of: dict[Request, int] = {}
        self.floats = self.ints = None
        self._resize(rows)
        # One step buffer per kind of gather: a step verifies chains, then samples its other rows.
        self._sample_step = StagingBuffer(1024, torch.int64, device)
        self._chain_step = StagingBuffer(1024, torch.int64, device)

    def _resize(self, rows: int) -> None:
        """Room for ``rows`` requests (the rows written so far kept)."""
        old = len(self.owner)
        floats, ints = (
            StagingBuffer(rows * _FLOATS, torch.float32, self.device),
            StagingBuffer(rows * _INTS, torch.int64, self.device),
        )
        if self.floats is not None:
            floats.numpy[: old * _FLOATS] = self.floats.numpy[: old * _FLOATS]
            ints.numpy[: old * _INTS] = self.ints.numpy[: old * _INTS]
        self.floats, self.ints = floats, ints
        self.host_floats = floats.numpy.reshape(rows, _FLOATS)
        self.host_ints = ints.numpy.reshape(rows, _INTS)
        self.owner += [None] * (rows - old)
        self._dirty = True

    def _row(self, request: Request) -> int:
        """The request's row; a new one gets its settings written (a finished owner's row is reused)."""
        row = self.row_of.get(request)
        if row is not None:
            return row
        if len(self.row_of) == len(self.owner):
            for done in [r for r in self.row_of if r.finished]:
                self.owner[self.row_of.pop(done)] = None
            if len(self.row_of) == len(self.owner):
                self._resize(2 * len(self.owner))
        row = self.owner.index(None)
        self.owner[row], self.row_of[request] = request, row
        self.floats.wait()  # as in _send: the last copy of the settings has read the host side
        self.ints.wait()
        params = request.params
        self.host_floats[row] = (
            1.0 if params.greedy else params.temperature,
            params.top_p,
            params.min_p,
            float(params.greedy),
        )
        seed = params.seed
        self.host_ints[row] = (
            clamp_top_k(params.top_k, self.vocab_size),
            0 if seed is None else seed + request.index,
            seed is not None,
        )
        self._dirty = True
        return row

    def _send(self, kind: str, *columns: list[int]) -> tuple[np.ndarray, list[torch.Tensor]]:
        """The columns (Python ints) packed into ``kind``'s step buffer, sent with one copy: the packed host
        array and each column's device view."""
        total = sum(len(c) for c in columns)
        name = f"_{kind}_step"
        buffer = getattr(self, name)
        if total > buffer.host.shape[0]:
            buffer = StagingBuffer(2 * total, torch.int64, self.device)
            setattr(self, name, buffer)
        buffer.wait()  # the previous step's copy may still be reading the host side (overlap scheduling)
        views, start = [], 0
        for column in columns:
            buffer.numpy[start : start + len(column)] = column
            views.append((start, start + len(column)))
            start += len(column)
        device = buffer.send(total)
        return buffer.numpy[:total], [device[a:b] for a, b in views]

    def _settings(self, rows: torch.Tensor, host_rows: np.ndarray) -> tuple[RowSettings, torch.Tensor]:
        """The settings of the sampled ``rows`` (device, and their host copy), and their seeds."""
        if self._dirty:
            self.floats.send(self.floats.host.shape[0])
            self.ints.send(self.ints.host.shape[0])
            self._dirty = False
        floats = self.floats.device.view(-1, _FLOATS).index_select(0, rows)
        ints = self.ints.device.view(-1, _INTS).index_select(0, rows)
        host_floats, host_ints = self.host_floats[host_rows], self.host_ints[host_rows]
        settings = RowSettings(
            temperature=floats[:, 0],
            greedy=floats[:, 3] > 0,
            top_k=ints[:, 0],
            top_p=floats[:, 1],
            min_p=floats[:, 2],
            max_top_k=int(host_ints[:, 0].max(initial=0)),
            uses_top_p=bool((host_floats[:, 1] < 1.0).any()),
            uses_min_p=bool((host_floats[:, 2] > 0.0).any()),
            any_greedy=bool(host_floats[:, 3].any()),
        )
        seeds = ints[:, 1:] if host_ints[:, 2].any() else None
        return settings, seeds

    @staticmethod
    def _uniforms(seeds: torch.Tensor | None, counters: torch.Tensor) -> torch.Tensor:
        """One number per row (float64 ``[M]``): a seeded row's ``counter_uniforms(seed, counter)``, the
        device's generator's for the others. ``seeds`` ``[M, 2]``: seed, seeded (0 / 1); None: no row is."""
        uniform = torch.rand(counters.shape[0], dtype=torch.float64, device=counters.device)
        if seeds is None:
            return uniform
        return torch.where(seeds[:, 1] > 0, counter_uniforms(seeds[:, 0], counters), uniform)

    def logits_index(self, logits_rows: list[int]) -> torch.Tensor:
        """``logits_rows`` on the device (the rows a greedy step takes the argmax of), via the step buffer."""
        return self._send("sample", logits_rows)[1][0]

    def sample_rows(self, requests: list[Request], logits_rows: list[int]) -> SampledRows:
        """One token per request, from logits row ``logits_rows[i]``; a seeded request's counter is the
        position of the token it draws (after any the host has not read yet: overlap scheduling)."""
        rows = [self._row(r) for r in requests]
        host, (index, settings_rows, counters) = self._send(
            "sample", logits_rows, rows, [r.num_tokens + r.num_pending for r in requests]
        )
        settings, seeds = self._settings(settings_rows, host[len(rows) : 2 * len(rows)])
        return SampledRows(index, settings, self._uniforms(seeds, counters))

    def chain_rows(
        self, requests: list[Request], drafts: list[list[int]], logits_starts: list[int]
    ) -> ChainRows:
        """The inputs of a batched verify: request ``b`` drafted ``drafts[b]``, its ``1 + len(drafts[b])``
        logits rows start at ``logits_starts[b]``. Row ``j``'s seeded draw counts at the position of the token
        it draws (``num_tokens + j``, as a plain draw would); draft ``j``'s acceptance number in a stream of
        its own (``ACCEPT_STREAM`` further)."""
        k = max(len(d) for d in drafts)
        index, rows, counters, padded = [], [], [], []
        for request, draft, start in zip(requests, drafts, logits_starts, strict=True):
            row, num = self._row(request), len(draft)
            index += [start + min(j, num) for j in range(k + 1)]
            rows += [row] * (k + 1)
            counters += range(request.num_tokens, request.num_tokens + k + 1)
            padded += [*draft, *[0] * (k - num)]
        host, (index_d, rows_d, counters_d, drafts_d, num_d) = self._send(
            "chain", index, rows, counters, padded, [len(d) for d in drafts]
        )
        settings, seeds = self._settings(rows_d, host[len(index) : 2 * len(index)])
        batch = len(requests)
        draw = self._uniforms(seeds, counters_d).view(batch, k + 1)
        accept_counters = counters_d.view(batch, k + 1)[:, :k].reshape(-1) + ACCEPT_STREAM
        accept_seeds = None if seeds is None else seeds.view(batch, k + 1, 2)[:, :k].reshape(-1, 2)
        accept = self._uniforms(accept_seeds, accept_counters).view(batch, k)
        return ChainRows(index_d, settings, drafts_d.view(batch, k), num_d, accept, draw)
