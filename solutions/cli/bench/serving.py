"""The server under load, in the manner of vLLM's ``benchmark_serving``:
``python -m solutions bench serving``.

Requests (chat prompts from data/prompts/, greedy, ``ignore_eos`` so each makes exactly ``--max-tokens``)
arrive as a Poisson process at ``--request-rate`` per second (``inf``: all at once, saturation), at most
``--max-concurrency`` in flight. Each is streamed, and its chunk times give vLLM's metrics:

    TTFT  first content chunk - send            ITL   gap between consecutive content chunks
    TPOT  (latency - TTFT) / (output tokens - 1)  E2EL  last chunk - send
    goodput: requests per second that met every latency target (``--goodput ttft:MS tpot:MS e2el:MS``)

By default it starts its own server (loopback only) with the engine options given, runs the same requests
offline through ``LLM.generate`` in the same run, and prints the server's throughput as a fraction of the
offline one. With ``--rounds R`` the server's pass and the offline pass alternate R times (server first in
odd rounds, offline first in even ones) and the figures pool the rounds: on a shared machine the load drifts
within minutes, and alternating lets the drift hit both sides alike (the per-round ratios show how much it
moved). Both sides run under the same environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ...), which the
server process inherits. Writes a JSON of every figure and per-request time, and a plot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from ...bench.machine import machine_name
from ...bench.serving import (
    DEFAULT_SLOS_MS,
    OfflineRunner,
    RequestResult,
    auth_headers,
    load_prompts,
    own_cpu_seconds,
    run_load,
    server_cpu_seconds,
    summarize,
)
from ...engine_options import add_engine_args, engine_options
from ...serve.launcher import running_server
from . import bench_parser


def plot(summary: dict[str, Any], path: Path) -> None:
    """Bars of mean / median / p99 for TTFT, TPOT, ITL and E2EL (one panel each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["ttft", "tpot", "itl", "e2el"]
    fig, axes = plt.subplots(1, 4, figsize=(13, 3.2))
    for ax, name in zip(axes, names):
        stats = summary[name]
        ax.bar(
            ["mean", "median", "p99"],
            [stats["mean_ms"], stats["median_ms"], stats["p99_ms"]],
            color="#4c72b0",
        )
        ax.set_title(name.upper())
        ax.set_ylabel("ms")
    rate = summary["config"]["request_rate"]
    fig.suptitle(
        f"{summary['completed']} requests, rate {rate}/s, "
        f"{summary['output_throughput']:.0f} output tokens/s ({summary['machine']})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_slos(items: list[str]) -> dict[str, float]:
    """``--goodput``'s ``NAME:MS`` items as ``{name: milliseconds}``; a name other than ttft, tpot or
    e2el is an error naming it."""
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput takes NAME:MS with NAME ttft, tpot or e2el; got {item!r}")
        slos[name] = float(value)
    return slos


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--num-requests", type=int, default=200)
    add("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (default: inf)")
    add("--max-concurrency", type=int, default=None, help="most requests in flight (default: all)")
    add("--max-tokens", type=int, default=32, help="output tokens per request (ignore_eos)")
    add("--goodput", nargs="*", default=[f"{k}:{v:g}" for k, v in DEFAULT_SLOS_MS.items()])
    add("--url", default=None, help="load a running server instead of starting one")
    add("--api-key", default=None)
    add("--no-offline", action="store_true", help="skip the offline LLM.generate comparison")
    add("--out", default="results/serving", help="writes OUT.json and OUT.png")
    add("--seed", type=int, default=0, help="seeds the Poisson arrival times")
    add("--rounds", type=int, default=1, help="server and offline passes, alternating (pooled)")
    add_engine_args(parser)
    args = parser.parse_args(argv)
    if args.num_requests < 1 or args.max_tokens < 2 or args.rounds < 1:
        parser.error("--num-requests and --rounds must be >= 1, and --max-tokens >= 2")
    options = engine_options(args)
    slos = parse_slos(args.goodput)
    prompts = load_prompts(args.num_requests)

    def load(url: str, prompts: list[str]) -> tuple[list[RequestResult], float]:
        model = httpx.get(f"{url}/v1/models", headers=auth_headers(args.api_key)).json()["data"][0]["id"]
        load_args = (args.max_tokens, args.request_rate, args.max_concurrency, args.api_key, args.seed)
        return asyncio.run(run_load(url, model, prompts, *load_args))

    offline = None if args.no_offline else OfflineRunner(options, prompts, args.max_tokens)
    with contextlib.ExitStack() as stack:
        if args.url:
            url = args.url
        else:
            url = stack.enter_context(running_server(options, api_key=args.api_key))
            load(url, prompts[:8])  # warm-up: the first requests pay for lazy imports and allocator growth
        results, duration, rounds = [], 0.0, []
        for i in range(args.rounds):  # server, offline, offline, server, ...: a drift of the load hits both
            round_ = {}
            for side in ("server", "offline") if i % 2 == 0 else ("offline", "server"):
                if side == "offline" and offline is not None:
                    cpu = time.process_time()
                    round_["offline_output_tokens"], round_["offline_duration_s"] = offline.run()
                    round_["offline_cpu_s"] = time.process_time() - cpu
                elif side == "server":
                    server_cpu, client_cpu = server_cpu_seconds(url), own_cpu_seconds()
                    served, seconds = load(url, prompts)
                    results += served
                    duration += seconds
                    round_["server_output_tokens"] = sum(r.output_tokens for r in served)
                    round_["server_duration_s"] = seconds
                    round_["server_cpu_s"] = server_cpu_seconds(url) - server_cpu
                    round_["client_cpu_s"] = own_cpu_seconds() - client_cpu
            rounds.append(round_)
    summary = summarize(results, duration, slos)
    summary["machine"] = machine_name()
    summary["config"] = {k: v for k, v in vars(args).items() if k not in ("goodput", "api_key")}
    summary["config"]["request_rate"] = str(args.request_rate)
    summary["rounds"] = rounds
    summary["requests"] = [asdict(r) for r in results]
    if offline is not None:
        total = lambda key: sum(r[key] for r in rounds)
        seconds, tokens = total("offline_duration_s"), total("offline_output_tokens")
        summary["offline"] = {
            "duration_s": seconds,
            "output_throughput": tokens / seconds,
            "request_throughput": args.rounds * len(prompts) / seconds,
        }
        summary["server_over_offline"] = (
            summary["output_throughput"] / summary["offline"]["output_throughput"]
        )
        summary["cpu_ms_per_output_token"] = {
            side: 1e3 * total(f"{side}_cpu_s") / total(f"{key}_output_tokens")
            for side, key in (("server", "server"), ("client", "server"), ("offline", "offline"))
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    plot(summary, out.with_suffix(".png"))
    _print(summary, out)
    return 0 if summary["failed"] == 0 else 1


def _met(met: bool) -> str:
    return "met" if met else "NOT met"


def _print(s: dict[str, Any], out: Path) -> None:
    print(f"machine: {s['machine']}")
    print(f"requests: {s['completed']} completed, {s['failed']} failed {s['errors'] or ''}")
    print(f"duration: {s['duration_s']:.2f} s")
    print(f"request throughput: {s['request_throughput']:.2f} req/s")
    print(f"output token throughput: {s['output_throughput']:.1f} tok/s")
    print(f"total token throughput: {s['total_token_throughput']:.1f} tok/s")
    slos = ", ".join(f"{k} <= {v:g} ms" for k, v in s["slos_ms"].items())
    print(f"goodput ({slos}): {s['goodput']:.2f} req/s")
    for name in ("ttft", "tpot", "itl", "e2el"):
        figures = "  ".join(f"{stat} {s[name][stat + '_ms']:.1f}" for stat in ("mean", "median", "p99"))
        print(f"{name.upper():>5} ms: {figures}")
    if "offline" in s:
        off = s["offline"]
        ratio = s["server_over_offline"]
        print(f"offline LLM.generate: {off['output_throughput']:.1f} tok/s over {off['duration_s']:.2f} s")
        if len(s["rounds"]) > 1:
            per_round = [
                (r["server_output_tokens"] / r["server_duration_s"])
                / (r["offline_output_tokens"] / r["offline_duration_s"])
                for r in s["rounds"]
            ]
            print("server / offline per round: " + ", ".join(f"{x:.3f}" for x in per_round))
        print(f"server / offline output throughput: {ratio:.3f} (goal >= 0.85: {_met(ratio >= 0.85)})")
        cpu = s["cpu_ms_per_output_token"]
        print(
            f"CPU ms per output token: server {cpu['server']:.2f} + load generator "
            f"{cpu['client']:.2f} vs offline {cpu['offline']:.2f}; offline / (server + load generator): "
            f"{cpu['offline'] / (cpu['server'] + cpu['client']):.3f}"
        )
        if ratio > 1.15:
            print("  (the server cannot beat the engine it runs on: the load changed between the runs)")
    print(f"goal: {s['completed'] + s['failed']} requests, none lost: {_met(s['failed'] == 0)}")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
