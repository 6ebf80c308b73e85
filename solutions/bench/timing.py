"""How every benchmark measures: one timer, one memory-bandwidth probe, one percentile.

- ``median_ms``: on CUDA the median of ``triton.testing.do_bench`` (its own warm-up and repeats, the L2 cache
  flushed before each, the device synchronised around them); elsewhere one warm-up call, then the median of
  ``repeats`` wall-clock runs.
- ``alternating_runs``: several candidates timed in rounds that run each once in turn, so a drift of a noisy
  machine's speed hits them alike (the CPU tables' and the notebooks' form); every round's time is kept, so
  ``bench.spread`` can state each one's spread and a verdict on any two. ``alternating_ms`` picks one figure
  per candidate from the same rounds.
- ``bandwidth_gbps``: a buffer copied on the device (bytes read + written, the GPU benches' ceiling) or summed
  (bytes read, what a decode step does to its weights: the CPU roofline), timed by ``median_ms``, so that
  every roofline and every "of copy" column is the same measurement.
- ``percentile``: linear interpolation between the nearest ranks (numpy's and vLLM's default).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

Device = str | torch.device


def on_cuda(device: Device) -> bool:
    return torch.device(device).type == "cuda"


def device_sync(device: Device) -> Callable[[], None]:
    """``torch.cuda.synchronize`` for a CUDA device; nothing to wait for on a CPU."""
    return torch.cuda.synchronize if on_cuda(device) else (lambda: None)


def median_ms(fn: Callable[[], object], device: Device = "cpu", repeats: int = 5) -> float:
    """Milliseconds of one ``fn()`` (see the module's docstring); ``repeats`` applies off CUDA."""
    if on_cuda(device):
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def alternating_runs(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Milliseconds of each ``fns[name]()`` in each round: one warm-up call each, then ``repeats`` rounds
    calling every one once in turn. Round ``i`` of every list ran side by side, so ratios pair them."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def alternating_ms(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    pick: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """``pick`` (the median, or ``min``) of each candidate's ``alternating_runs``."""
    return {name: pick(t) for name, t in alternating_runs(fns, repeats).items()}


def timer_name(device: Device, repeats: int = 5) -> str:
    """What ``median_ms`` reports on ``device``, for a table's caption."""
    return "median of triton.testing.do_bench" if on_cuda(device) else f"median of {repeats} after a warm-up"


def bandwidth_gbps(nbytes: int, device: Device = "cpu", copy: bool = True, repeats: int = 5) -> float:
    """GB/s of ``device``'s memory: ``dst.copy_(src)`` of ``nbytes`` (read + write bytes), or with
    ``copy=False`` the sum of an ``nbytes`` float32 buffer (read bytes); pick ``nbytes`` above any cache."""
    if on_cuda(device) and not torch.cuda.is_available():
        raise RuntimeError(f"bandwidth on {device}: torch sees no CUDA GPU")
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if not copy:
        return nbytes / (median_ms(src.sum, device, repeats) * 1e-3) / 1e9
    dst = torch.empty_like(src)
    return 2 * src.nbytes / (median_ms(lambda: dst.copy_(src), device, repeats) * 1e-3) / 1e9


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
