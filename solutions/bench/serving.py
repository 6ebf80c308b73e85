"""The server under load, in the manner of vLLM's ``benchmark_serving``: ``python -m solutions bench serving``.

Requests (chat prompts from data/prompts/, greedy, ``ignore_eos`` so each makes exactly ``--max-tokens``)
arrive as a Poisson process at ``--request-rate`` per second (``inf``: all at once, saturation), at most
``--max-concurrency`` in flight. Each is streamed, and its chunk times give vLLM's metrics:

    TTFT  first content chunk - send            ITL   gap between consecutive content chunks
    TPOT  (latency - TTFT) / (output tokens - 1)  E2EL  last chunk - send
    goodput: requests per second that met every latency target (``--goodput ttft:MS tpot:MS e2el:MS``)

By default it starts its own server (loopback only) with the engine options given, runs the same requests
offline through ``LLM.generate`` in the same run, and prints the server's throughput as a fraction of the
offline one. With ``--rounds R`` the server's pass and the offline pass alternate R times (server first in
odd rounds, offline first in even ones) and the figures pool the rounds: on a shared machine the load drifts within minutes, and alternating lets the drift hit
both sides alike (the per-round ratios show how much it moved). Both sides run under the same
environment (``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``, ...), which the server process inherits.
Writes a JSON of every figure and per-request time, and a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..engine_options import add_engine_args, engine_options

PROMPT_FILE = Path(__file__).resolve().parents[2] / "data" / "prompts" / "serving_prompts.txt"
DEFAULT_SLOS_MS = {"ttft": 5000.0, "tpot": 500.0}


def load_prompts(num_requests: int, path: Path = PROMPT_FILE) -> list[str]:
    """``num_requests`` user prompts: the file's lines in order, repeated as often as needed."""
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path} holds no prompts")
    return [lines[i % len(lines)] for i in range(num_requests)]


@dataclass
class RequestResult:
    """One request as the client saw it (seconds, from the benchmark's start)."""

    sent: float
    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    finished: float = 0.0

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def e2el(self) -> float:
        return self.finished - self.sent

    @property
    def tpot(self) -> float | None:
        return None if self.output_tokens < 2 else (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]


async def run_load(
    url: str,
    model: str,
    prompts: list[str],
    max_tokens: int,
    request_rate: float = math.inf,
    max_concurrency: int | None = None,
    api_key: str | None = None,
    seed: int = 0,
    timeout_s: float = 600,
) -> tuple[list[RequestResult], float]:
    """Send every prompt (Poisson arrivals at ``request_rate``/s), stream the replies; returns the results in
    prompt order and the wall time from the first send to the last reply."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=timeout_s, limits=limits) as client:
        start = time.perf_counter()

        async def one(prompt: str) -> RequestResult:
            if gate is None:
                return await _stream_one(client, model, prompt, max_tokens, start)
            async with gate:
                return await _stream_one(client, model, prompt, max_tokens, start)

        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(one(prompt)))
            if math.isfinite(request_rate):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


async def _stream_one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, t0: float):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(sent=time.perf_counter() - t0)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                result.error = f"HTTP {reply.status_code}: {(await reply.aread()).decode()[:200]}"
                return result
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    result.chunk_times.append(time.perf_counter() - t0)
        result.finished = time.perf_counter() - t0
        result.ok = bool(result.chunk_times) and result.output_tokens == max_tokens
        if not result.ok:
            result.error = f"got {result.output_tokens} of {max_tokens} tokens"
    except httpx.HTTPError as error:
        result.error = repr(error)
    return result


def _stats(values: list[float]) -> dict[str, float]:
    """Mean, median and p99 in milliseconds (vLLM's percentile: linear interpolation)."""
    if not values:
        return {"mean_ms": float("nan"), "median_ms": float("nan"), "p99_ms": float("nan")}
    ordered = sorted(values)
    rank = 0.99 * (len(ordered) - 1)
    low = math.floor(rank)
    p99 = ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (rank - low)
    return {
        "mean_ms": 1e3 * statistics.fmean(values),
        "median_ms": 1e3 * statistics.median(values),
        "p99_ms": 1e3 * p99,
    }


def summarize(results: list[RequestResult], duration_s: float, slos_ms: dict[str, float]) -> dict[str, Any]:
    """vLLM's serving figures over the completed requests; ``failed`` counts the rest."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    good = [r for r in done if all(1e3 * _slo_value(r, name) <= limit for name, limit in slos_ms.items())]
    return {
        "completed": len(done),
        "failed": len(results) - len(done),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration_s,
        "total_input_tokens": sum(r.prompt_tokens for r in done),
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": sum(r.prompt_tokens + r.output_tokens for r in done) / duration_s,
        "goodput": len(good) / duration_s,
        "slos_ms": slos_ms,
        "ttft": _stats([r.ttft for r in done]),
        "tpot": _stats([r.tpot for r in done if r.tpot is not None]),
        "itl": _stats([gap for r in done for gap in r.itls]),
        "e2el": _stats([r.e2el for r in done]),
    }


def _slo_value(result: RequestResult, name: str) -> float:
    value = {"ttft": result.ttft, "tpot": result.tpot, "e2el": result.e2el}[name]
    return 0.0 if value is None else value


class OfflineRunner:
    """The same requests through ``LLM.generate`` in this process: the ceiling the server is held to.

    Built once (and warmed up) so that its passes can alternate with the server's."""

    def __init__(self, options: dict[str, Any], prompts: list[str], max_tokens: int):
        from ..engine.sampling_params import SamplingParams
        from ..llm import LLM

        self.llm = LLM(**options)
        self.chats = [
            self.llm.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts
        ]
        self.params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        self.llm.generate(self.chats[: min(4, len(self.chats))], self.params, use_tqdm=False)  # warm-up

    def run(self) -> tuple[int, float]:
        """One pass over every request: (output tokens, seconds)."""
        start = time.perf_counter()
        outputs = self.llm.generate(self.chats, self.params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs), time.perf_counter() - start


def server_cpu_seconds(url: str) -> float:
    """CPU seconds the server process has used so far (Prometheus's ``process_cpu_seconds_total``)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    raise RuntimeError(f"{url}/metrics reports no process_cpu_seconds_total")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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


def machine() -> str:
    """The CPU model (from lscpu) and, when there is one, the GPU."""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        cpu = next(
            line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu} ({os.cpu_count()} CPUs){gpu}"


def _parse_slos(items: list[str]) -> dict[str, float]:
    slos = {}
    for item in items:
        name, _, value = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput takes NAME:MS with NAME ttft, tpot or e2el; got {item!r}")
        slos[name] = float(value)
    return slos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions bench serving", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument(
        "--request-rate", type=float, default=math.inf, help="requests/s, Poisson (default: inf)"
    )
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="most requests in flight (default: all)"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (ignore_eos)")
    parser.add_argument("--goodput", nargs="*", default=[f"{k}:{v:g}" for k, v in DEFAULT_SLOS_MS.items()])
    parser.add_argument("--url", default=None, help="load a running server instead of starting one")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--no-offline", action="store_true", help="skip the offline LLM.generate comparison")
    parser.add_argument("--out", default="results/serving", help="writes OUT.json and OUT.png")
    parser.add_argument("--seed", type=int, default=0, help="seeds the Poisson arrival times")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="server and offline passes, alternating (figures pool all rounds)",
    )
    add_engine_args(parser)
    args = parser.parse_args(argv)
    if args.num_requests < 1 or args.max_tokens < 2 or args.rounds < 1:
        parser.error("--num-requests and --rounds must be >= 1, and --max-tokens >= 2")
    options = engine_options(args)
    slos = _parse_slos(args.goodput)
    prompts = load_prompts(args.num_requests)

    def load(url: str, prompts: list[str]) -> tuple[list[RequestResult], float]:
        model = httpx.get(f"{url}/v1/models", headers=_auth(args.api_key)).json()["data"][0]["id"]
        return asyncio.run(
            run_load(
                url,
                model,
                prompts,
                args.max_tokens,
                args.request_rate,
                args.max_concurrency,
                args.api_key,
                args.seed,
            )
        )

    offline = None if args.no_offline else OfflineRunner(options, prompts, args.max_tokens)
    with contextlib.ExitStack() as stack:
        if args.url:
            url = args.url
        else:
            from ..serve.launcher import running_server

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
                    server_cpu, client_cpu = server_cpu_seconds(url), _own_cpu_seconds()
                    served, seconds = load(url, prompts)
                    results += served
                    duration += seconds
                    round_["server_output_tokens"] = sum(r.output_tokens for r in served)
                    round_["server_duration_s"] = seconds
                    round_["server_cpu_s"] = server_cpu_seconds(url) - server_cpu
                    round_["client_cpu_s"] = _own_cpu_seconds() - client_cpu
            rounds.append(round_)
    summary = summarize(results, duration, slos)
    summary["machine"] = machine()
    summary["config"] = {k: v for k, v in vars(args).items() if k not in ("goodput", "api_key")}
    summary["config"]["request_rate"] = str(args.request_rate)
    summary["rounds"] = rounds
    summary["requests"] = [asdict(r) for r in results]
    if offline is not None:
        seconds = sum(r["offline_duration_s"] for r in rounds)
        tokens = sum(r["offline_output_tokens"] for r in rounds)
        summary["offline"] = {
            "duration_s": seconds,
            "output_throughput": tokens / seconds,
            "request_throughput": args.rounds * len(prompts) / seconds,
        }
        summary["server_over_offline"] = (
            summary["output_throughput"] / summary["offline"]["output_throughput"]
        )
        summary["cpu_ms_per_output_token"] = {
            side: 1e3
            * sum(r[f"{side}_cpu_s"] for r in rounds)
            / sum(r[f"{key}_output_tokens"] for r in rounds)
            for side, key in (("server", "server"), ("client", "server"), ("offline", "offline"))
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    plot(summary, out.with_suffix(".png"))
    _print(summary, out)
    return 0 if summary["failed"] == 0 else 1


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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
        st = s[name]
        print(
            f"{name.upper():>5} ms: mean {st['mean_ms']:.1f}  median {st['median_ms']:.1f}  p99 {st['p99_ms']:.1f}"
        )
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
        print(
            f"server / offline output throughput: {ratio:.3f} (goal >= 0.85: {'met' if ratio >= 0.85 else 'NOT met'})"
        )
        cpu = s["cpu_ms_per_output_token"]
        print(
            f"CPU ms per output token: server {cpu['server']:.2f} + load generator {cpu['client']:.2f} vs offline "
            f"{cpu['offline']:.2f}; offline / (server + load generator): "
            f"{cpu['offline'] / (cpu['server'] + cpu['client']):.3f}"
        )
        if ratio > 1.15:
            print(
                "  (the server cannot beat the engine it runs on: the machine's load changed between the two runs)"
            )
    print(
        f"goal: {s['completed'] + s['failed']} requests, none lost: {'met' if s['failed'] == 0 else 'NOT met'}"
    )
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
