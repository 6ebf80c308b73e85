"""``bench gpu`` end to end on a CPU with the tiny shape (the document's structure, never timing), and its
parts: the shapes' checkpoints, the profile's counting, the workload, and sections that fail, time out or
cannot run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from solutions.bench.decode_steps import summarize_profile
from solutions.bench.gpu_report import Report, SectionSkipped, run_header
from solutions.bench.model_shapes import SHAPES, write_random_checkpoint
from solutions.cli.bench import gpu
from solutions.model.loader import load_hf_folder

CPU_SECTIONS = ["bandwidth", "decode", "profile", "sweep", "throughput"]


def _run(tmp_path: Path, *extra: str) -> tuple[int, dict, str]:
    code = gpu.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--max-num-seqs", "4", *extra])
    (json_path,) = tmp_path.glob("gpu_*.json")
    return code, json.loads(json_path.read_text()), json_path.with_suffix(".md").read_text()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[int, dict, str]:
    folder = tmp_path_factory.mktemp("bench_gpu")
    return _run(folder, "--shapes", "tiny", "--graph-stand-in", "--sections", *CPU_SECTIONS)


def test_every_cpu_section_runs_and_reports(tiny_run):
    code, doc, _ = tiny_run
    assert code == 0
    header = doc["header"]
    assert header["device"] == "cpu" and header["preset"] == "quick"
    assert header["command"].startswith("python -m solutions bench gpu --device cpu")
    assert all(header[k] for k in ("machine", "date", "commit", "torch", "triton", "transformers"))
    assert doc["bandwidth"]["status"] == "ok" and doc["bandwidth"]["copy_GBps"] > 0
    tiny = doc["shapes"]["tiny"]
    assert list(tiny) == ["model", "engines", "decode", "profile", "sweep", "throughput"]
    assert all(section["status"] == "ok" for section in tiny.values()), {
        k: v.get("error") for k, v in tiny.items()
    }
    assert tiny["model"]["weight_bytes"] == SHAPES["tiny"].weight_bytes()
    assert "speculative" not in doc, "the spec section was not asked for"


def test_decode_rows_share_one_roofline(tiny_run):
    decode = tiny_run[1]["shapes"]["tiny"]["decode"]
    rows = {r["engine"]: r for r in decode["rows"]}
    assert list(rows) == ["eager", "graphs", "sampled", "hf"]
    assert "stand-in" in rows["graphs"]["label"] and "temperature 0.8, top-p 0.95" in rows["sampled"]["label"]
    assert decode["weight_bytes_per_token"] > 0 and decode["roofline_tok_s"] > 0
    for r in rows.values():
        assert r["tok_s"] > 0
        assert r["ms_per_token"] == pytest.approx(1e3 / r["tok_s"])
        assert r["roofline_share"] == pytest.approx(r["tok_s"] / decode["roofline_tok_s"])
    assert decode["ratios"]["graphs_vs_hf"] == pytest.approx(rows["graphs"]["tok_s"] / rows["hf"]["tok_s"])
    sampled = decode["ratios"]["sampled_vs_greedy"]
    assert sampled == pytest.approx(rows["sampled"]["tok_s"] / rows["graphs"]["tok_s"])


def test_start_up_is_recorded_per_engine_and_graph_bucket(tiny_run):
    """Tuning and capture happen in the engines section, before any timed one: each engine's build seconds,
    and per captured bucket its seconds and memory (None for the CPU stand-in); eager has no graphs."""
    rows = {r["engine"]: r for r in tiny_run[1]["shapes"]["tiny"]["engines"]["rows"]}
    assert list(rows) == ["eager", "graphs", "hf"]
    assert all(r["build_s"] > 0 for r in rows.values())
    assert rows["eager"]["captures"] == [] and rows["eager"]["tuned_calls"] == 0, "nothing tunes on a CPU"
    captures = rows["graphs"]["captures"]
    assert [c["bucket"] for c in captures] == [4, 2, 1], "buckets up to max_num_seqs, largest first"
    assert all(c["MiB"] is None and c["seconds"] > 0 for c in captures)
    assert rows["graphs"]["capture_s"] == pytest.approx(sum(c["seconds"] for c in captures))


def test_step_profile_leaves_device_figures_unmeasured_on_a_cpu(tiny_run):
    profile = tiny_run[1]["shapes"]["tiny"]["profile"]
    assert profile["on_cuda"] is False
    assert [(r["engine"], r["batch"]) for r in profile["rows"]] == [
        ("eager", 1),
        ("eager", 4),
        ("graphs", 1),
        ("graphs", 4),
    ]
    for r in profile["rows"]:
        assert r["wall_ms"] > 0
        assert r["gpu_busy_ms"] is None and r["kernels"] is None and r["host_syncs"] is None


def test_sweep_covers_powers_of_two_up_to_max_num_seqs(tiny_run):
    sweep = tiny_run[1]["shapes"]["tiny"]["sweep"]
    assert [(r["engine"], r["batch"]) for r in sweep["rows"]] == [
        (e, b) for e in ("eager", "graphs") for b in (1, 2, 4)
    ]
    for r in sweep["rows"]:
        assert r["per_request_tok_s"] == pytest.approx(1e3 / r["step_ms"])
        assert r["aggregate_tok_s"] == pytest.approx(r["batch"] * r["per_request_tok_s"])


def test_throughput_counts_the_same_workload_for_both(tiny_run):
    """The stand-in engine overlaps its scheduling as a CUDA one does, so the section also times it with
    overlap scheduling off, on the same number of tokens."""
    throughput = tiny_run[1]["shapes"]["tiny"]["throughput"]
    workload = throughput["workload"]
    ours, off, hf = throughput["rows"]
    assert [r["engine"] for r in (ours, off, hf)] == ["graphs", "graphs-sync", "hf"]
    assert workload["requests"] == ours["requests"] == off["requests"] == hf["requests"] == 16
    assert ours["output_tokens"] == off["output_tokens"] == hf["output_tokens"] == workload["output_tokens"]
    assert ours["output_tok_s"] == pytest.approx(ours["output_tokens"] / ours["wall_s"])
    assert throughput["ratio_vs_hf"] == pytest.approx(ours["output_tok_s"] / hf["output_tok_s"])
    assert throughput["overlap_ratio"] == pytest.approx(ours["output_tok_s"] / off["output_tok_s"])
    assert throughput["keys_tuned_in_timed_run"] == 0


def test_markdown_holds_every_section_table(tiny_run):
    markdown = tiny_run[2]
    for heading in (
        "Copy bandwidth",
        "## tiny",
        "### Start-up: tuning and graph capture",
        "### Batch-1 decode",
        "### One decode step",
        "### Batch sweep",
        "### Offline throughput",
        "| engine | tok/s | ms/token | of roofline |",
    ):
        assert heading in markdown


def test_spec_rows_say_they_need_the_bundled_model(tmp_path, monkeypatch):
    from solutions.model import loader

    def missing():
        raise FileNotFoundError("not installed")

    monkeypatch.setattr(loader, "bundled_model_path", missing)
    code, doc, markdown = _run(tmp_path, "--sections", "spec")
    assert code == 0, "a section that cannot run here is skipped, not failed"
    assert doc["speculative"]["status"] == "skipped"
    assert "need the bundled model" in doc["speculative"]["reason"]
    assert "need the bundled model" in markdown and "shapes" not in doc


def test_step_breakdown_splits_decode_steps_into_parts(tiny_folder):
    """The spec rows' breakdown: every decode step after the prefill, its parts adding up to the step, and the
    share of forwards a graph replayed (here recorded graphs: all of them, drafts verified included)."""
    from solutions import LLM, SamplingParams
    from solutions.bench.step_split import step_breakdown
    from solutions.engine.cuda_graphs import RecordedCall

    llm = LLM(
        model=str(tiny_folder), device="cpu", dtype="float32", skip_tokenizer_init=True, max_num_seqs=1,
        max_model_len=128, speculative="ngram", num_speculative_tokens=3,
    )  # fmt: skip
    engine = llm.engine
    engine.runner.capture_decode_graphs(engine.config.max_graph_rows, RecordedCall)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    parts = step_breakdown(llm, [5, 6, 7, 8] * 4, params, lambda: None)
    assert 1 <= parts["steps"] <= 19, "one token comes from the prefill, each decode step adds at least one"
    assert parts["draft_ms"] > 0 and parts["forward_ms"] > 0 and parts["other_ms"] > 0
    total = parts["draft_ms"] + parts["forward_ms"] + parts["other_ms"]
    assert total == pytest.approx(parts["step_ms"])
    assert parts["graph_share"] == 1.0
    assert engine.runner.execute.__name__ == "execute", "the breakdown put the runner back as it was"
    assert not engine.has_unfinished_requests()


def test_unknown_shape_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu.main(["--device", "cpu", "--shapes", "llama-9000"])
    assert exit_.value.code == 2
    assert "unknown shape(s) llama-9000" in capsys.readouterr().err


def test_failing_slow_and_impossible_sections_are_recorded_and_the_run_goes_on(tmp_path):
    report = Report(tmp_path, run_header("cpu", "test", "abc", "quick", 60), time_limit_s=60)

    def fails(section):
        section.out["rows"] = [1]  # measured before the failure: kept
        raise ValueError("bad input")

    def too_slow(section):
        section.out["rows"] = [2]
        time.sleep(5)

    def cannot(section):
        raise SectionSkipped("needs a GPU")

    assert not report.section(report.data, "bandwidth", 5, fails)
    assert report.data["bandwidth"]["status"] == "failed" and report.data["bandwidth"]["rows"] == [1]
    assert "ValueError: bad input" in report.data["bandwidth"]["error"]
    shapes = report.data.setdefault("shapes", {"tiny": {}})
    assert not report.section(shapes["tiny"], "sweep", 0.2, too_slow)
    assert shapes["tiny"]["sweep"]["status"] == "timed out" and shapes["tiny"]["sweep"]["rows"] == [2]
    assert not report.section(report.data, "speculative", 5, cannot)
    assert report.data["speculative"] == {"status": "skipped", "seconds": 0.0, "reason": "needs a GPU"}
    assert not report.section(report.data, "bandwidth", 5, fails, reserve_s=55), "past the deadline: skipped"
    assert report.data["bandwidth"]["status"] == "skipped"
    saved = json.loads(report.json_path.read_text())
    assert saved["shapes"]["tiny"]["sweep"]["status"] == "timed out", (
        "the document is written after each section"
    )
    assert "markdown not rendered: KeyError" in report.md_path.read_text(), (
        "a partial table must not stop the run"
    )


def test_a_section_saves_its_rows_the_moment_they_exist(tmp_path):
    """A run killed mid-section (the session's outer timeout) still leaves every row measured on disk."""
    report = Report(tmp_path, run_header("cpu", "test", "abc", "quick", 60), time_limit_s=60)
    on_disk = []

    def measure(section):
        section.out["rows"] = []
        for row in (1, 2):
            section.out["rows"].append(row)
            section.save()
            on_disk.append(json.loads(report.json_path.read_text())["bandwidth"])

    assert report.section(report.data, "bandwidth", 5, measure)
    assert [(d["status"], d["rows"]) for d in on_disk] == [("running", [1]), ("running", [1, 2])]
    assert json.loads(report.json_path.read_text())["bandwidth"]["status"] == "ok"


def test_random_checkpoint_loads_as_the_shape(tmp_path):
    shape = SHAPES["tiny"]
    weights = load_hf_folder(write_random_checkpoint(shape, tmp_path), load_tokenizer=False)
    c = weights.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.intermediate_size, c.vocab_size) == (
        64,
        2,
        4,
        2,
        128,
        512,
    )
    assert c.tie_word_embeddings and "lm_head.weight" not in weights.state_dict
    assert set(weights.state_dict) == set(shape.tensor_shapes())
    norm = weights.state_dict["model.layers.1.post_attention_layernorm.weight"]
    assert norm.dtype == torch.bfloat16 and bool((norm == 1).all())
    up = weights.state_dict["model.layers.0.mlp.up_proj.weight"].float()
    assert up.shape == (128, 64) and abs(up.std().item() - 0.02) < 0.002 and abs(up.mean().item()) < 0.002


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("smollm2-135m", 134_515_008),
        ("smollm2-1.7b", 1_711_376_384),
        ("llama-3.2-1b", 1_235_814_400),
        ("llama-3.1-8b", 8_030_261_248),
    ],
)
def test_named_shapes_have_the_real_models_parameter_counts(name, params):
    shape = SHAPES[name]
    assert shape.weight_bytes() == 2 * params
    assert ("lm_head.weight" in shape.tensor_shapes()) == (not shape.tie_word_embeddings)


def test_summarize_profile_counts_per_step():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    event = lambda key, count, device, us=0.0: SimpleNamespace(  # noqa: E731
        key=key, count=count, device_type=device, self_device_time_total=us
    )
    events = [
        event("nvjet_gemm", 40, cuda, 800.0),
        event("triton_fused_norm", 20, cuda, 100.0),
        event("Memcpy HtoD (Pageable -> Device)", 6, cuda, 30.0),
        event("Memcpy HtoD (Pinned -> Device)", 2, cuda, 10.0),
        event("Memcpy DtoH (Device -> Pageable)", 2, cuda, 10.0),
        event("Memset (Device)", 2, cuda, 50.0),
        event("cudaStreamSynchronize", 4, cpu),
        event("cudaLaunchKernel", 60, cpu),
    ]
    counts = summarize_profile(events, steps=2, on_cuda=True)
    assert counts == {
        "gpu_busy_ms": 0.5,
        "kernels": 30,
        "host_syncs": 2,
        "h2d_copies": 4,
        "h2d_pageable": 3,
        "d2h_copies": 1,
    }
    assert set(summarize_profile(events, steps=2, on_cuda=False).values()) == {None}


def test_nano_vllm_workload_is_seeded_and_in_range():
    """``bench gpu``'s throughput workload: ``make_workload`` without a tokenizer (nano-vllm's)."""
    from solutions.bench.throughput import make_workload

    s = gpu.QUICK
    workload = make_workload(None, s.requests, s.prompt_lens, s.output_lens, 0, 512)
    prompts, output_lens = workload.prompts, workload.output_lens
    assert workload == make_workload(None, s.requests, s.prompt_lens, s.output_lens, 0, 512)
    assert len(prompts) == len(output_lens) == s.requests
    assert all(s.prompt_lens[0] <= len(p) <= s.prompt_lens[1] for p in prompts)
    assert all(s.output_lens[0] <= n <= s.output_lens[1] for n in output_lens)
    assert max(max(p) for p in prompts) < 512
