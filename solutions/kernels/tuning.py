"""Autotuning the attention kernels: ``triton.autotune`` on CUDA, one fixed configuration in the interpreter.

``TunedKernel`` wraps a jitted kernel whose tile sizes and launch options are meta-parameters. On a GPU the
first call with a new tuning key times every configuration briefly (``quick_bench``) and keeps the fastest for
that key; the interpreter, where timing means nothing, always runs ``interpreter_config``. Keys are host
integers (head dim, block size, and lengths bucketed to powers of two by ``pow2_bucket``), so a new batch or
context length seldom triggers a new tuning, and nothing on the host reads a device value.

A CUDA graph cannot record a tuning run (it synchronises the device): while the current stream is capturing, a
key that was never tuned is refused with an error that says which warm-up call would have tuned it.

``FASTMODE_AUTOTUNE=0`` runs each kernel's first configuration that fits, untimed, on CUDA too: correctness
runs on a GPU then compile one variant per kernel instead of every candidate.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch
import triton


def pow2_bucket(n: int, low: int, high: int) -> int:
    """``n`` rounded up to a power of two, clamped to ``[low, high]``: a tuning key that changes rarely."""
    return min(max(triton.next_power_of_2(max(n, 1)), low), high)


def autotunes_on(device: torch.device) -> bool:
    """Whether launches on ``device`` are autotuned: compiled CUDA kernels only (timings in the interpreter
    mean nothing)."""
    return device.type == "cuda"


def quick_bench(kernel_call: Callable[[], object], quantiles: Sequence[float]) -> list[float]:
    """The autotuner's timer, shortened from Triton's 25 + 100 ms per configuration: the configurations
    differ by tens of percent, and a tuning happens inside an engine's warm-up."""
    import triton.testing

    return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)


def tuned_key_count() -> int:
    """How many (kernel, key) pairs this process has autotuned so far: a benchmark reads it before and after a
    timed region to show that no tuning ran inside it."""
    return sum(len(kernel.tuned_keys) for kernel in TunedKernel.instances)


class TunedKernel:
    """``kernel`` autotuned over ``configs`` on CUDA (keyed on the keyword arguments named in ``key`` and the
    dtypes of the tensor arguments, as ``triton.autotune`` does), run with ``interpreter_config`` elsewhere.

    ``prune(configs, head_dim)`` may drop configurations that cannot fit a head dim (``HEAD_DIM`` is then a
    keyword argument of every call). Call it as ``tuned(grid, *args, **kwargs)``, ``grid`` a function of the
    chosen configuration's meta-parameters (``lambda meta: (...)``), never passing a tuned meta-parameter.
    ``instances`` holds every one made (``tuned_key_count`` sums their keys)."""

    instances: list[TunedKernel] = []

    def __init__(
        self,
        kernel: triton.JITFunction,
        configs: list[triton.Config],
        key: list[str],
        interpreter_config: triton.Config,
        warm_up_hint: str,
        prune: Callable[[list[triton.Config], int], list[triton.Config]] | None = None,
    ):
        self.kernel = kernel
        self.key = key
        self.configs = configs
        self.prune = prune
        self.interpreter_config = interpreter_config
        self.warm_up_hint = warm_up_hint
        early_prune = None
        if prune is not None:
            early_prune = lambda configs, nargs, **kwargs: prune(configs, kwargs["HEAD_DIM"])  # noqa: E731
        self.autotuned = triton.autotune(
            configs, key=key, prune_configs_by={"early_config_prune": early_prune}, do_bench=quick_bench
        )(kernel)
        self.tuned_keys: set[tuple] = set()
        TunedKernel.instances.append(self)

    def __call__(self, grid: Callable[[dict], tuple[int, ...]], *args, **kwargs) -> None:
        if not autotunes_on(args[0].device) or os.environ.get("FASTMODE_AUTOTUNE", "1") == "0":
            config = self._fixed_config(args[0].device, kwargs.get("HEAD_DIM"))
            self.kernel[grid(config.kwargs)](*args, **kwargs, **config.all_kwargs())
            return
        named = dict(zip(self.kernel.arg_names, args)) | kwargs
        key = (
            *(named[name] for name in self.key),
            *(str(a.dtype) for a in args if isinstance(a, torch.Tensor)),
        )
        if key not in self.tuned_keys and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"{self.kernel.__name__} was never tuned for {dict(zip(self.key, key))} and a CUDA graph is "
                f"being captured, which cannot record a tuning run: {self.warm_up_hint}"
            )
        self.autotuned[grid](*args, **kwargs)
        self.tuned_keys.add(key)

    def _fixed_config(self, device: torch.device, head_dim: int | None) -> triton.Config:
        """The interpreter's configuration, or on CUDA with autotuning off the first candidate that fits."""
        if not autotunes_on(device):
            return self.interpreter_config
        return (self.prune(self.configs, head_dim) if self.prune else self.configs)[0]

    @property
    def last_config(self) -> triton.Config | None:
        """The configuration the most recent CUDA call ran (None before any): benchmarks print it."""
        return getattr(self.autotuned, "best_config", None)
