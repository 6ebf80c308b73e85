"""The serving benchmark's arithmetic (vLLM's definitions), on hand-made request timelines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solutions.bench.serving import RequestResult, _stats, load_prompts, summarize
from solutions.cli.bench.serving import parse_slos
from solutions.engine_options import engine_argv


def _request(sent, chunk_times, output_tokens, prompt_tokens=10):
    return RequestResult(
        sent=sent,
        ok=True,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        chunk_times=chunk_times,
        finished=chunk_times[-1],
    )


def test_per_request_metrics_follow_vllm():
    r = _request(1.0, [1.5, 1.7, 2.0, 2.1], output_tokens=4)
    assert r.ttft == pytest.approx(0.5)
    assert r.e2el == pytest.approx(1.1)
    assert r.tpot == pytest.approx((1.1 - 0.5) / 3)
    assert r.itls == pytest.approx([0.2, 0.3, 0.1])
    assert _request(0.0, [0.4], output_tokens=1).tpot is None


def test_percentiles_match_numpy_linear_interpolation():
    values = [0.003 * i**1.5 for i in range(1, 58)]
    stats = _stats(values)
    assert stats["p99_ms"] == pytest.approx(1e3 * np.percentile(values, 99))
    assert stats["median_ms"] == pytest.approx(1e3 * np.median(values))
    assert stats["mean_ms"] == pytest.approx(1e3 * np.mean(values))
    assert math.isnan(_stats([])["p99_ms"])


def test_summary_counts_failures_throughput_and_goodput():
    fast = _request(0.0, [0.1, 0.2, 0.3], output_tokens=3)  # TTFT 100 ms, TPOT 100 ms
    slow = _request(0.0, [2.0, 2.5, 3.0], output_tokens=3)  # TTFT 2000 ms, TPOT 500 ms
    lost = RequestResult(sent=0.5, error="HTTP 500: boom")
    summary = summarize([fast, slow, lost], duration_s=4.0, slos_ms={"ttft": 1000, "tpot": 200})
    assert summary["completed"] == 2 and summary["failed"] == 1 and summary["errors"] == ["HTTP 500: boom"]
    assert summary["output_throughput"] == pytest.approx(6 / 4)
    assert summary["total_token_throughput"] == pytest.approx(26 / 4)
    assert summary["request_throughput"] == pytest.approx(2 / 4)
    assert summary["goodput"] == pytest.approx(1 / 4)  # only the fast one meets both targets
    assert summary["ttft"]["median_ms"] == pytest.approx(1050)


def test_prompts_repeat_in_order_and_bad_targets_are_named():
    prompts = load_prompts(205)
    assert len(prompts) == 205 and prompts[100] == prompts[0] and len(set(prompts)) == 100
    with pytest.raises(ValueError, match="ttfb"):
        parse_slos(["ttfb:100"])


def test_engine_argv_round_trips_through_the_cli_flags():
    import argparse

    from solutions.engine_options import add_engine_args, engine_options

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    options = engine_options(parser.parse_args(["--device", "cpu", "--max-num-seqs", "4"]))
    assert engine_options(parser.parse_args(engine_argv(options))) == options
