"""The CPU matrix product each linear layer runs, chosen by measurement on this machine.

A decode step is a chain of matrix-vector products, and which of torch's CPU routes streams the
weights fastest depends on the CPU: eager ``F.linear`` (MKL) is the fastest route on one x86 machine
and reads less than half of what oneDNN's prepacked product reads on another (``bench decode`` prints every
route's GB/s per shape; the README gives two machines). So nothing is assumed: for each weight
shape of the model and each regime of rows per call (``decode``: 1 row; ``rows2`` .. ``rows64``: 2 to 64 rows,
a verify pass's root and drafts or a few sequences decoding together, in power-of-two buckets, a call taking
the smallest bucket that holds its rows; ``prefill``: more rows, a prompt's tokens), every candidate path is
timed on the model's own weights and the fastest one is kept.

Candidate paths (each stores the weight in the layout it needs):

- ``linear``: eager ``F.linear`` over the ``[out, in]`` weight (MKL's GEMV/GEMM on x86).
- ``transposed``: ``x @ W_t`` over a contiguous ``[in, out]`` copy.
- ``onednn``: oneDNN's linear over a weight reordered once into its blocked layout
  (``mkldnn._reorder_linear_weight``; the route ``torch.compile``'s CPU backend takes).
- ``packed``: the course's own kernel (``cpu_rows.py``): the weight in blocks of 16 output columns, each read
  once whatever the rows, each row summed in one fixed order. Where the machine has a C compiler.

Not candidates, measured and left out: ``torch.compile`` of a linear (slower than oneDNN's product where it
was timed, and seconds of compilation per shape at every load) and MKL's packed GEMM (``mkl._mkl_linear``: a
fixed batch size and two copies of the weight, slower than oneDNN where measured).

The decision is cached per machine in ``cache_dir()/cpu_linear.json``, keyed by the CPU (model name
and a hash of its feature flags), torch's version and thread count, and the candidate list (the file keeps
the last few keys' decisions side by side); a cache that is missing, unreadable or malformed, or holds
nothing for this key, is ignored and measured again.
Decisions measured while the machine was busy (load average above the CPU count) are marked, and
measured again by the first load that finds the machine quiet.
``$FASTMODE_CPU_LINEAR`` set to a path's name forces that path everywhere (tests, comparisons).
``$FASTMODE_BATCH_INVARIANT=1`` (``kernels/batch_invariant.py``) runs the ``packed`` kernel at every row count
(each row summed in one fixed order), or where it cannot, oneDNN's product for the dtypes it takes, a lone row
padded to two, so that a row's result does not depend on the rows beside it.

Invariant: every path computes ``F.linear(x, weight, bias)`` (same math, different summation order).
The ``weight`` Parameter stays the ``[out, in]`` tensor it was, so code that reads or edits it keeps
working; a path's own layout is made from it on first use and remade if the weight is edited in place.
"""

from __future__ import annotations

import copy as copy_module
import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..paths import cache_dir
from . import cpu_rows
from .batch_invariant import batch_invariant

CACHE_VERSION = 2
MAX_MACHINES = 8  # machine keys a cache file keeps decisions for, the most recently written first
CACHE_FILE = "cpu_linear.json"
FORCE_ENV = "FASTMODE_CPU_LINEAR"
# rows per call each regime is timed at; a call of r rows takes the first regime of at least r rows
REGIMES = {
    "decode": 1,
    "rows2": 2,
    "rows4": 4,
    "rows8": 8,
    "rows16": 16,
    "rows32": 32,
    "rows64": 64,
    "prefill": 128,
}
SMALL_ROWS = 64  # up to this many rows per call, the small-row buckets; more rows: the prefill choice
WORKING_SET_BYTES = 96 << 20  # weights cycled through per timing: larger than the L3 caches of common CPUs
ROUNDS = 5
LAYOUT_SLACK = 1.05  # a regime keeps a layout another regime holds when it is within 5% of its fastest
SHAPE_ROUNDS = 3  # per weight shape (4 paths x 8 regimes): 3 alternated rounds keep a cold start short


@dataclass(frozen=True)
class LinearPath:
    """One way to compute ``x @ W^T + b``: ``store`` makes the layout from the ``[out, in]`` weight once (a
    tensor, or what the path's kernel takes), ``apply(x2d, stored, bias)`` runs on a contiguous ``[rows, in]``
    input."""

    name: str
    store: Callable[[torch.Tensor], object]
    apply: Callable[[torch.Tensor, object, torch.Tensor | None], torch.Tensor]
    supports: Callable[[torch.dtype], bool]


def _transposed_apply(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX512-BF16 or AMX), as oneDNN reports it."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _onednn_supports(dtype: torch.dtype) -> bool:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and native_bf16())


PATHS: dict[str, LinearPath] = {
    path.name: path
    for path in (
        LinearPath("linear", lambda w: w, lambda x, w, b: F.linear(x, w, b), lambda dtype: True),
        LinearPath("transposed", lambda w: w.t().contiguous(), _transposed_apply, lambda dtype: True),
        LinearPath(
            "onednn",
            lambda w: torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None),
            lambda x, w, b: torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], ""),
            _onednn_supports,
        ),
        LinearPath("packed", cpu_rows.pack, cpu_rows.apply, cpu_rows.supports),
    )
}


class CpuLinear(nn.Linear):
    """``nn.Linear`` that runs the path chosen for its shape in each regime
    (``choices``: regime -> path name)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, choices: dict[str, str]):
        nn.Module.__init__(self)
        self.out_features, self.in_features = weight.shape
        self.weight, self.bias = weight, bias
        unknown = set(choices.values()) - PATHS.keys()
        if set(choices) != REGIMES.keys() or unknown:
            raise ValueError(f"choices must name a path for each of {list(REGIMES)}; got {choices}")
        self.choices = dict(choices)
        # Batch-invariant mode: oneDNN at every row count, one row run as two (its one-row kernel sums in
        # another order for inputs wider than 1024).
        self.pad_single_row = False
        self._stored: dict[str, tuple[int, object]] = {}  # path -> (weight version it was made at, layout)
        self._by_rows = rows_table({r: PATHS[choices[r]] for r in REGIMES})  # rows 0..SMALL_ROWS -> path
        self._prefill = PATHS[choices["prefill"]]

    @classmethod
    def from_linear(cls, linear: nn.Linear, choices: dict[str, str]) -> CpuLinear:
        """Wrap ``linear``'s own weight and bias Parameters (shared, not copied)."""
        return cls(linear.weight, linear.bias, choices)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows == 1 and self.pad_single_row:
            path = self._by_rows[2]
            flat = x.reshape(1, self.in_features).expand(2, -1).contiguous()
            out = path.apply(flat, self.stored(path.name), self.bias)[:1]
            return out.view(*x.shape[:-1], self.out_features)
        path = self._by_rows[rows] if rows <= SMALL_ROWS else self._prefill
        if path.name == "linear":
            return F.linear(x, self.weight, self.bias)
        out = path.apply(x.reshape(rows, self.in_features).contiguous(), self.stored(path.name), self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def stored(self, path: str) -> object:
        """The weight in ``path``'s layout, made on first use and remade after an
        in-place edit of ``weight``."""
        version = self.weight._version
        entry = self._stored.get(path)
        if entry is None or entry[0] != version:
            with torch.no_grad():
                entry = (version, PATHS[path].store(self.weight.detach()))
            self._stored[path] = entry
        return entry[1]

    def __deepcopy__(self, memo: dict) -> CpuLinear:
        """A copy with its own weight;
        derived layouts (oneDNN's opaque tensors cannot be copied) are remade."""
        copy = CpuLinear.__new__(CpuLinear)
        memo[id(self)] = copy
        state = {k: v for k, v in self.__dict__.items() if k != "_stored"}
        copy.__dict__.update(copy_module.deepcopy(state, memo))
        copy._stored = {}
        return copy

    def extra_repr(self) -> str:
        picks = ", ".join(f"{regime}: {path}" for regime, path in self.choices.items())
        return f"{super().extra_repr()}, {picks}"


def regime_of(rows: int, regimes: dict[str, int] = REGIMES) -> str:
    """The regime a call of ``rows`` rows runs in: the first (fewest rows) timed at ``rows`` or more, else
    the last one (a prompt's rows)."""
    return next((name for name, timed in regimes.items() if rows <= timed), list(regimes)[-1])


def rows_table(by_regime: dict[str, object]) -> list:
    """``table[r]``: what ``by_regime`` holds for the regime of ``r`` rows, r = 0..SMALL_ROWS (a list
    lookup in the hot path instead of a search)."""
    return [by_regime[regime_of(max(1, rows))] for rows in range(SMALL_ROWS + 1)]


# ---- the decision cache ---------------------------------------------------------------------------


def _cpu_info() -> dict[str, str]:
    """The first CPU's fields in ``/proc/cpuinfo`` (empty where there is none)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def cpu_model() -> str:
    """This machine's CPU model name ("AMD EPYC 9R14 ..."), or the platform's name for it."""
    return _cpu_info().get("model name") or platform.processor() or platform.machine()


def machine_key(candidates: dict[str, object] | None = None) -> dict[str, object]:
    """What a decision depends on: the CPU, torch's build and threads, and the ``candidates`` compared
    (default: this file's paths and regimes; ``model/cpu_layer_ops.py`` passes its own)."""
    info = _cpu_info()
    flags = info.get("flags") or info.get("Features", "")
    return {
        "cache_version": CACHE_VERSION,
        "cpu": cpu_model(),
        "cpu_flags": hashlib.sha1(flags.encode()).hexdigest()[:12],
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        **(candidates if candidates is not None else {"paths": sorted(PATHS), "regimes": REGIMES}),
    }


def cache_path() -> Path:
    return cache_dir() / CACHE_FILE


def shape_key(out_features: int, in_features: int, dtype: torch.dtype) -> str:
    return f"{str(dtype).removeprefix('torch.')}:{out_features}x{in_features}"


def _valid_entry(entry: object, paths: Iterable[str], regimes: dict[str, int] = REGIMES) -> bool:
    """An entry is ``{regime: {"path": name, "us": {name: float}}}`` for every regime of ``regimes``, with
    names from ``paths``."""
    if not isinstance(entry, dict) or set(entry) != regimes.keys():
        return False
    for pick in entry.values():
        if (
            not isinstance(pick, dict)
            or pick.get("path") not in paths
            or not isinstance(pick.get("us"), dict)
        ):
            return False
        if pick["path"] not in pick["us"]:
            return False
        if not all(name in paths and isinstance(v, int | float) and v > 0 for name, v in pick["us"].items()):
            return False
    return True


def _machine_entries(path: Path) -> list[dict]:
    """The cache file's entries, ``{"machine", "decisions", "measured_busy"}`` one per machine key (most
    recently written first); none where the file is missing, unreadable or malformed."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("machines") if isinstance(data, dict) else None
    return [entry for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def _canonical(machine: dict[str, object] | None) -> dict[str, object]:
    """``machine`` (default this file's ``machine_key``) as the cache file holds it (JSON types)."""
    return json.loads(json.dumps(machine or machine_key()))


def _entry_for(path: Path, machine: dict[str, object] | None) -> dict:
    """The cache file's entry for ``machine`` (default this file's ``machine_key``), or ``{}``."""
    canonical = _canonical(machine)
    return next((entry for entry in _machine_entries(path) if entry.get("machine") == canonical), {})


def read_decisions(
    path: Path | None = None,
    machine: dict[str, object] | None = None,
    paths: Iterable[str] = PATHS,
    regimes: dict[str, int] = REGIMES,
) -> dict[str, dict]:
    """The cached decisions for this machine (``machine``: a ``machine_key``, default this file's),
    or ``{}`` if the file is missing, unreadable, malformed or holds none for it. An entry naming a path
    outside ``paths`` is dropped."""
    decisions = _entry_for(path or cache_path(), machine).get("decisions")
    if not isinstance(decisions, dict):
        return {}
    return {key: entry for key, entry in decisions.items() if _valid_entry(entry, set(paths), regimes)}


def machine_busy() -> bool:
    """Whether other work competes for the CPUs now (1-minute load average above the CPU count)."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return False


def noisy_keys(path: Path | None = None, machine: dict[str, object] | None = None) -> set[str]:
    """Shape keys whose decision was measured while the machine was busy (to re-measure when it is quiet)."""
    noisy = _entry_for(path or cache_path(), machine).get("measured_busy", [])
    return {key for key in noisy if isinstance(key, str)} if isinstance(noisy, list) else set()


def write_decisions(
    decisions: dict[str, dict],
    path: Path | None = None,
    busy: Iterable[str] = (),
    machine: dict[str, object] | None = None,
) -> None:
    """Write ``machine``'s entry atomically (a crash never leaves half a file), keeping the other machine
    keys' entries (the same CPU at another thread count, say: the tests run one thread, a notebook two), up
    to ``MAX_MACHINES``; an unwritable cache directory is not an error.

    ``busy`` names the decisions measured on a busy machine: a later load on a quiet one measures them again.
    """
    path = path or cache_path()
    machine = _canonical(machine)
    others = [entry for entry in _machine_entries(path) if entry.get("machine") != machine]
    entry = {"machine": machine, "decisions": decisions, "measured_busy": sorted(busy)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        content = {"machines": [entry, *others][:MAX_MACHINES]}
        partial.write_text(json.dumps(content, indent=1))
        partial.replace(path)
    except OSError:
        pass


# ---- measuring ------------------------------------------------------------------------------------


def seconds_per_call(calls: list[Callable[[], object]]) -> float:
    start = time.perf_counter()
    for call in calls:
        call()
    return (time.perf_counter() - start) / len(calls)


def fastest_rounds(calls: dict[str, list[Callable[[], object]]], rounds: int = ROUNDS) -> dict[str, float]:
    """Seconds per call of each candidate's ``calls``: rounds alternate between the candidates
    and each keeps its fastest round, so a burst of load from other processes does not decide.
    One warm-up pass each first."""
    for fns in calls.values():
        seconds_per_call(fns)  # warm up: first-call set-up, page faults
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, fns in calls.items():
            best[name] = min(best[name], seconds_per_call(fns))
    return best


@torch.no_grad()
def measure_shape(weights: list[torch.Tensor], rounds: int = SHAPE_ROUNDS) -> dict[str, dict]:
    """Time every supported path on ``weights`` (same shape and dtype) in each regime:
    ``{regime: {path, us}}``, the winner's name and every path's microseconds per call.

    The weights are cycled through (up to ``WORKING_SET_BYTES``, at least two) so that each call reads
    its weight from memory, as a decode step does, not from a cache that the previous call warmed.
    Rounds alternate between the paths and each path keeps its fastest round, so a burst of load from
    other processes does not decide. A path whose output differs from ``F.linear``'s is dropped.
    """
    k, dtype = weights[0].shape[1], weights[0].dtype
    count = max(2, min(len(weights), WORKING_SET_BYTES // max(1, weights[0].nbytes)))
    generator = torch.Generator().manual_seed(0)
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    entry = {}
    for regime, rows in REGIMES.items():
        # Prefill is compute-bound: two weights suffice there, and keep the measurement short.
        pool = [weights[i % len(weights)] for i in range(2 if regime == "prefill" else count)]
        x = torch.randn(rows, k, generator=generator).to(dtype)
        expected = F.linear(x, pool[0]).float()
        calls: dict[str, list[Callable[[], object]]] = {}
        for name, path in PATHS.items():
            if not path.supports(dtype):
                continue
            try:
                stored = [path.store(w) for w in pool]
                got = path.apply(x, stored[0], None).float()
            except RuntimeError:
                continue  # this build or CPU cannot run the path
            if got.shape != expected.shape or (got - expected).norm() > tolerance * expected.norm():
                continue
            calls[name] = [lambda s=s, path=path, x=x: path.apply(x, s, None) for s in stored]
        best = fastest_rounds(calls, rounds)
        entry[regime] = {
            "path": min(best, key=best.get),
            "us": {name: round(t * 1e6, 2) for name, t in best.items()},
        }
    return entry


def choose_paths(
    weights_by_shape: dict[tuple[int, int, torch.dtype], list[torch.Tensor]], use_cache: bool = True
) -> dict[str, dict]:
    """Decisions for every shape: from the cache where it has them, measured (and cached) where not."""
    measures = {
        shape_key(*shape): functools.partial(measure_shape, ws) for shape, ws in weights_by_shape.items()
    }
    return cached_decisions(measures, use_cache)


def cached_decisions(
    measures: dict[str, Callable[[], dict]],
    use_cache: bool = True,
    path: Path | None = None,
    machine: dict[str, object] | None = None,
    paths: Iterable[str] = PATHS,
    regimes: dict[str, int] = REGIMES,
) -> dict[str, dict]:
    """Every cached decision, plus ``measures[key]()`` for each key the cache lacks (then written back).

    ``path``, ``machine``, ``paths`` and ``regimes`` name another cache (default: this file's), as
    ``read_decisions`` takes them.
    """
    path = path or cache_path()
    decisions = read_decisions(path, machine, paths, regimes) if use_cache else {}
    busy = noisy_keys(path, machine) & decisions.keys() if use_cache else set()
    busy_now = machine_busy()
    if not busy_now:  # decisions taken under load are noise: retake them now that the machine is quiet
        for key in busy:
            del decisions[key]
        busy = set()
    missing = [key for key in measures if key not in decisions]
    for key in missing:
        decisions[key] = measures[key]()
        if busy_now:
            busy.add(key)
    if missing and use_cache:
        write_decisions(decisions, path, busy, machine)
    return decisions


def forced_choices() -> dict[str, str] | None:
    """``{regime: path}`` from ``$FASTMODE_CPU_LINEAR``, or None when unset. Raises on an unknown name."""
    name = os.environ.get(FORCE_ENV)
    if not name:
        return None
    if name not in PATHS:
        raise ValueError(f"${FORCE_ENV} must be one of {sorted(PATHS)}, got {name!r}")
    return dict.fromkeys(REGIMES, name)


def _linears(model: nn.Module) -> Iterable[tuple[nn.Module, str, nn.Linear]]:
    for parent in model.modules():
        for child_name, child in parent.named_children():
            if type(child) is nn.Linear or isinstance(child, CpuLinear):
                yield parent, child_name, child


def use_fastest_linears(model: nn.Module, use_cache: bool = True) -> dict[str, dict]:
    """Replace every ``nn.Linear`` of a CPU ``model`` by a ``CpuLinear`` running the measured fastest paths.

    Returns the decisions used (shape key -> ``{regime: {path, us}}``), also kept as
    ``model.linear_decisions`` for reports. Weights are shared, not copied; ties survive.
    """
    decisions: dict[str, dict] = {}
    if forced_choices() is None:
        by_shape: dict[tuple[int, int, torch.dtype], list[torch.Tensor]] = {}
        seen = set()
        for _, _, linear in _linears(model):
            if linear.weight.data_ptr() not in seen:
                seen.add(linear.weight.data_ptr())
                by_shape.setdefault((*linear.weight.shape, linear.weight.dtype), []).append(
                    linear.weight.detach()
                )
        decisions = choose_paths(by_shape, use_cache)
    use_linear_decisions(model, decisions)
    return decisions


def use_linear_decisions(model: nn.Module, decisions: dict[str, dict]) -> None:
    """Replace each ``nn.Linear`` of ``model`` by a ``CpuLinear`` running the paths ``decisions`` name for its
    shape (``$FASTMODE_CPU_LINEAR``'s path when set); a shape they do not name keeps ``F.linear``. Kept as
    ``model.linear_decisions``. A tensor-parallel worker takes rank 0's decisions here instead of measuring:
    it runs fewer threads than rank 0, so its timings would be filed under another machine key."""
    forced, invariant = forced_choices(), batch_invariant()
    for parent, child_name, linear in list(_linears(model)):
        key = shape_key(linear.out_features, linear.in_features, linear.weight.dtype)
        decision = decisions.get(key)
        choices = forced or (decision and economical_choices(decision))
        dtype = linear.weight.dtype
        packed = invariant and forced is None and PATHS["packed"].supports(dtype)
        pad = invariant and forced is None and not packed and PATHS["onednn"].supports(dtype)
        if packed or pad:
            choices = dict.fromkeys(REGIMES, "packed" if packed else "onednn")
        if choices:
            cpu_linear = CpuLinear.from_linear(linear, choices)
            cpu_linear.pad_single_row = pad
            setattr(parent, child_name, cpu_linear)
    model.linear_decisions = decisions


def economical_choices(decision: dict[str, dict]) -> dict[str, str]:
    """``{regime: path}`` for one shape's measured ``decision``: the fewest weight layouts that give every
    regime a path within ``LAYOUT_SLACK`` of its fastest (each layout but ``linear``'s is a whole copy of the
    weight, made on first use). Greedy: the path near enough for the most regimes left, ``linear`` (the weight
    itself) first on a tie, then the path of least summed time over those regimes."""
    near = {
        regime: {path for path, us in pick["us"].items() if us <= LAYOUT_SLACK * min(pick["us"].values())}
        for regime, pick in decision.items()
    }
    choices: dict[str, str] = {}
    while len(choices) < len(decision):
        left = [regime for regime in decision if regime not in choices]
        path = max(
            {p for regime in left for p in near[regime]}, key=lambda p: _coverage(p, left, near, decision)
        )
        choices.update({regime: path for regime in left if path in near[regime]})
    return choices


def _coverage(path: str, regimes: list[str], near: dict[str, set[str]], decision: dict[str, dict]) -> tuple:
    """How well ``path`` serves ``regimes``: how many it is near enough for, whether it is the weight itself,
    less its summed time over them."""
    covered = [regime for regime in regimes if path in near[regime]]
    return len(covered), path == "linear", -sum(decision[regime]["us"][path] for regime in covered)


def decisions_line(decisions: dict[str, dict]) -> str:
    """One line for a log: how many shapes, and the path each regime chose how often."""
    forced = forced_choices()
    if forced is not None:
        return f"CPU linears: ${FORCE_ENV} forces the {forced['decode']} path"
    counts = {regime: sorted({entry[regime]["path"] for entry in decisions.values()}) for regime in REGIMES}
    picks = "; ".join(f"{regime}: {', '.join(paths)}" for regime, paths in counts.items())
    return (
        f"CPU linears: the paths measured fastest for {len(decisions)} weight shapes ({picks}; cached in "
        f"{cache_path()}; ${FORCE_ENV}=linear skips the measuring)"
    )


def fastest_linear(weight: torch.Tensor, use_cache: bool = True) -> CpuLinear:
    """A bias-free ``CpuLinear`` computing ``x @ weight.T`` by the paths measured fastest for ``weight``'s
    shape (``[out, in]``, shared, frozen): for a matrix held as a tensor rather than in an ``nn.Linear``."""
    holder = nn.Module()
    holder.linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    holder.linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
    use_fastest_linears(holder, use_cache)
    return holder.linear


def parse_shape_key(key: str) -> tuple[str, int, int]:
    dtype, _, shape = key.partition(":")
    out_features, in_features = (int(v) for v in shape.split("x"))
    return dtype, out_features, in_features


def rates(key: str, regime: str, us: float) -> tuple[float, float]:
    """(GB/s of weight read, GFLOP/s) of one call of ``us`` microseconds for shape ``key`` in ``regime``."""
    dtype, n, k = parse_shape_key(key)
    element = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    return n * k * element / us / 1e3, 2 * REGIMES[regime] * n * k / us / 1e3


def summary(decisions: dict[str, dict]) -> list[str]:
    """One line per shape and regime: the winner, then each path's GB/s
    (decode, batch) or GFLOP/s (prefill)."""
    lines = []
    for key, entry in decisions.items():
        for regime, pick in entry.items():
            unit = 1 if regime == "prefill" else 0
            figures = "  ".join(
                f"{name} {rates(key, regime, us)[unit]:6.1f}" for name, us in sorted(pick["us"].items())
            )
            lines.append(f"{key:<18}{regime:<9}{pick['path']:<12}{figures} {'GFLOP/s' if unit else 'GB/s'}")
    return lines
