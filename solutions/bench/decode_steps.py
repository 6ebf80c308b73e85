"""Steady-state decode on a running engine: ``batch`` requests prefilled, then decode steps one at a time,
each timed alone (wall clock around the step, the device synchronised) or run under ``torch.profiler``.

Prefill is excluded by construction: ``start_decodes`` steps the engine until every request has its first
token, and ``decode_step_times`` checks that each timed step advanced exactly ``batch`` requests by one token
each (no prefill chunk, no finished or preempted request in the step).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable

import torch

from ..engine.engine import Engine
from ..sampling_params import SamplingParams
from .timing import device_sync

# Host-side CUDA runtime calls that block the CPU until the device catches up.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly (seeded) from the vocabulary."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(count)]


def start_decodes(engine: Engine, batch: int, prompt_len: int, max_tokens: int, seed: int = 0) -> list[str]:
    """Queue ``batch`` greedy requests (random prompts of ``prompt_len`` tokens, ``max_tokens`` each, EOS
    ignored) and step until every one has produced its first token. Returns their ids; the caller aborts them
    when done."""
    if batch > engine.config.max_num_seqs:
        raise ValueError(f"batch {batch} is above the engine's max_num_seqs={engine.config.max_num_seqs}")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(batch, prompt_len, engine.model_config.vocab_size, seed)
    ids = engine.add_requests(prompts, [params] * batch)
    started: set[str] = set()
    for _ in range(batch * prompt_len + 1):  # a step computes at least one prompt token: the loop's bound
        started.update(out.request_id for out in engine.step() if out.outputs[0].token_ids)
        if len(started) == batch:
            return ids
    raise RuntimeError(f"{batch - len(started)} of {batch} requests never produced a first token")


def _decode_step(engine, batch: int) -> None:
    advanced = engine.step()
    if len(advanced) != batch:
        raise RuntimeError(
            f"a decode step advanced {len(advanced)} requests, not {batch}: one finished or was preempted "
            "(raise max_tokens or the KV cache), so this is not a steady-state step"
        )


def decode_step_times(engine: Engine, steps: int, batch: int, sync: Callable[[], None]) -> list[float]:
    """Seconds of each of ``steps`` decode steps of ``batch`` requests, from a synchronised device to one."""
    times = []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        _decode_step(engine, batch)
        sync()
        times.append(time.perf_counter() - start)
    return times


def profile_decode_steps(engine: Engine, steps: int, batch: int, device: str) -> dict[str, float | None]:
    """Run ``steps`` decode steps under ``torch.profiler``; per step, what ``summarize_profile`` counts."""
    from torch.profiler import ProfilerActivity, profile

    on_cuda = device.startswith("cuda")
    sync = device_sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            _decode_step(engine, batch)
        sync()
    return summarize_profile(prof.key_averages(), steps, on_cuda)


def summarize_profile(averages: Iterable, steps: int, on_cuda: bool) -> dict[str, float | None]:
    """Per step, from ``torch.profiler``'s ``key_averages()``: device busy time (every kernel and copy,
    summed), kernels (copies and memsets left out), host syncs (``SYNC_CALLS``), host-to-device copies (and
    how many of them from pageable memory, which the host waits for) and device-to-host copies. Device figures
    are None without CUDA: a CPU has no kernels to count."""
    if not on_cuda:
        return dict.fromkeys(
            ("gpu_busy_ms", "kernels", "host_syncs", "h2d_copies", "h2d_pageable", "d2h_copies")
        )
    busy_us = kernels = syncs = h2d = pageable = d2h = 0.0
    for event in averages:
        name, count = event.key, event.count
        if event.device_type == torch.autograd.DeviceType.CUDA:
            busy_us += event.self_device_time_total
            if name.startswith("Memcpy HtoD"):
                h2d += count
                pageable += count if "Pageable" in name else 0
            elif name.startswith("Memcpy DtoH"):
                d2h += count
            elif not name.startswith(("Memcpy", "Memset")):
                kernels += count
        elif name in SYNC_CALLS:
            syncs += count
    return {
        "gpu_busy_ms": busy_us / 1e3 / steps,
        "kernels": kernels / steps,
        "host_syncs": syncs / steps,
        "h2d_copies": h2d / steps,
        "h2d_pageable": pageable / steps,
        "d2h_copies": d2h / steps,
    }
