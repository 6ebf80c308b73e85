"""The measuring helpers that the notebooks and benchmarks use (correctness only, never timing)."""

from __future__ import annotations

import time

import pytest
import torch

from solutions.bench.batching import measure_batch_speed
from solutions.bench.roofline import decode_bytes_per_token, measure_read_bandwidth


def test_decode_bytes_count_a_tied_head_once(llm):
    model = llm.engine.model
    assert model.lm_head.weight is model.embed_tokens.weight
    assert decode_bytes_per_token(model) == 134_515_008 * 4


def test_decode_bytes_of_an_untied_head_skip_the_embedding_table():
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(10, 4)
    model.lm_head = torch.nn.Linear(4, 10, bias=False)
    assert decode_bytes_per_token(model) == (40 + 4) * 4


def test_read_bandwidth_is_a_positive_rate():
    assert measure_read_bandwidth(nbytes=1 << 20, repeats=2) > 0


def test_batch_speed_accounts_for_every_token(llm):
    speed = measure_batch_speed(llm, batch_size=3, new_tokens=5)
    assert speed.batch_size == 3 and speed.new_tokens == 5
    assert speed.aggregate_tokens_per_s == pytest.approx(15 / speed.wall_s)
    assert 0 < speed.ttft_s < speed.wall_s and speed.tpot_s > 0
    assert speed.per_user_tokens_per_s <= speed.aggregate_tokens_per_s
    with pytest.raises(ValueError, match="max_num_seqs"):
        measure_batch_speed(llm, batch_size=99)


def test_step_split_counts_every_linear_of_a_step():
    from solutions.bench.step_split import attention_flops, linear_flops, linear_seconds, step_linears
    from solutions.model.config import ModelConfig
    from solutions.model.llama import LlamaModel

    config = ModelConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5,
        max_position_embeddings=64, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaModel(config)
    model = model.to_empty(device="cpu")
    linears = step_linears(model)
    assert len(linears) == 2 * 4 + 1 and linears[-1] is model.lm_head
    # per layer: qkv 32 -> 64, o 32 -> 32, gate_up 32 -> 96, down 48 -> 32; the head 32 -> 64 on one row
    per_token = 2 * (32 * 64 + 32 * 32 + 32 * 96 + 48 * 32)
    assert linear_flops(model, rows=10) == 2 * 10 * per_token + 2 * 32 * 64
    assert attention_flops(config, 3) == 2 * 2 * 2 * 4 * 8 * 6
    assert linear_seconds(model, rows=3, repeats=1) > 0


def test_bench_help_reaches_the_named_benchmark(capsys):
    """`bench NAME --help` lists that benchmark's own options, not the list of benchmarks."""
    from solutions.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["bench", "throughput", "--help"])
    assert exit_.value.code == 0
    assert "--num-requests" in capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    assert "throughput" in capsys.readouterr().out
    assert main(["bench"]) == 2, "`bench` without a name is a usage error"


def test_bench_host_times_every_batch_kind_and_mark(capsys):
    """``bench host``: a row per batch and mark, a figure per output kind; ``StoredLogits`` replays its
    capture's logits without computing."""
    from solutions.cli.bench import host

    assert host.main(["--batches", "1", "3", "--marks", "2", "5", "--steps", "2"]) == 0
    rows = [
        line.split() for line in capsys.readouterr().out.splitlines() if line.split()[:1] in (["1"], ["3"])
    ]
    assert [row[:2] for row in rows] == [["1", "2"], ["1", "5"], ["3", "2"], ["3", "5"]]
    assert all(len(row) == 7 and float(row[2]) > 0 for row in rows), rows
    recorded = host.StoredLogits()
    first = recorded.capture(lambda: (torch.ones(2, 3), torch.ones(2, 4)))
    assert recorded.replay() is first, "a replay returns the captured logits and states, computing nothing"


def test_bench_host_simulates_a_device_that_overlapped_scheduling_hides_host_work_behind(capsys):
    """``--device-us``: a device that runs queued steps one after another and an event that waits for the work
    queued before it; a row per batch with both schedules' step times and what each leaves exposed."""
    from solutions.cli.bench import host

    stream = host.SimulatedStream()
    start = time.perf_counter()
    stream.run(0.004)
    stream.run(0.004)  # queued behind the first
    event = stream.event()
    event.record()
    assert event.at >= start + 0.008
    event.synchronize()
    assert time.perf_counter() >= event.at
    assert host.main(["--batches", "1", "2", "--marks", "2", "--steps", "2", "--device-us", "300"]) == 0
    table = capsys.readouterr().out.split("Overlap scheduling")[1].splitlines()
    rows = [line.split() for line in table if line.split()[:1] in (["1"], ["2"])]
    assert [row[0] for row in rows] == ["1", "2"] and all(len(row) == 5 for row in rows), rows
    assert all(float(sync) >= 300 and float(overlap) > 0 for _, sync, overlap, *_ in rows), (
        "a synchronous step waits for its device work"
    )
    with pytest.raises(SystemExit):
        host.main(["--device-us", "0"])


def test_baseline_moe_reads_every_shape_of_the_gpu_table():
    from solutions.fast_mode.gpu_results import baseline_moe

    rows = baseline_moe()
    assert [(r.hidden, r.width) for r in rows] == [(4096, 14336), (2048, 1408), (1024, 2816)]
    assert (rows[0].grouped_ms, rows[0].loop_ms, rows[0].dense_ms) == (8.183, 5.819, 4.719)


def test_moe_decode_models_have_the_parameters_they_claim_and_decode(tmp_path):
    from solutions.bench.moe_decode import MoeShape, decode_call, load_engines

    shape = MoeShape(hidden=64, width=96, layers=1, heads=4, kv_heads=2, vocab=128, experts=4, top_k=2)
    engines = load_engines(shape, tmp_path, kv_cache_memory=1 << 20)
    counted = {name: sum(p.numel() for p in llm.engine.model.parameters()) for name, llm in engines.items()}
    router = shape.layers * shape.experts * shape.hidden
    assert counted["moe"] == shape.parameters(shape.experts * shape.width) + router
    assert counted["dense, same total"] == shape.parameters(shape.experts * shape.width)
    assert counted["dense, same active"] == shape.parameters(shape.top_k * shape.width)
    assert engines["moe"].engine.model_config.num_experts_per_tok == 2
    outputs = decode_call(engines["moe"], 5)()
    assert len(outputs[0].outputs[0].token_ids) == 5
    with pytest.raises(ValueError, match="top_k"):
        MoeShape(experts=2, top_k=3)
