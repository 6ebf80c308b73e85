"""What ``python -m solutions bench serving`` measures with (``cli/bench/serving.py``; notebook 08 uses the
same), in the manner of vLLM's ``benchmark_serving``: chat prompts from data/prompts/, a load generator that
streams each request and times its chunks (Poisson arrivals at a rate, at most so many in flight), vLLM's
metrics over the results (TTFT, TPOT, ITL, E2EL, goodput against latency targets), the same requests run
offline through ``LLM.generate``, and the CPU seconds each side used."""

from __future__ import annotations

import asyncio
import json
import math
import random
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..llm import LLM
from ..sampling_params import SamplingParams
from .timing import percentile

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
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    headers = auth_headers(api_key)
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


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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
    return {
        "mean_ms": 1e3 * statistics.fmean(values),
        "median_ms": 1e3 * statistics.median(values),
        "p99_ms": 1e3 * percentile(values, 99),
    }


def summarize(results: list[RequestResult], duration_s: float, slos_ms: dict[str, float]) -> dict[str, Any]:
    """vLLM's serving figures over the completed requests; ``failed`` counts the rest."""
    done = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in done)
    within = lambda r, name, limit: 1e3 * (getattr(r, name) or 0.0) <= limit  # no TPOT (1 token): 0
    good = [r for r in done if all(within(r, name, limit) for name, limit in slos_ms.items())]
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


class OfflineRunner:
    """The same requests through ``LLM.generate`` in this process: the ceiling the server is held to.

    Built once (and warmed up) so that its passes can alternate with the server's."""

    def __init__(self, options: dict[str, Any], prompts: list[str], max_tokens: int):
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


def own_cpu_seconds() -> float:
    """CPU seconds this process has used so far (user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
