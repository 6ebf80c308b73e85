"""Every ``python -m solutions bench NAME`` runs to the end on toy sizes (correctness of the script, never its
figures): the commands that other test files do not already run (attention, paged_attention, kernels, moe,
int4 with ``--smoke``; gpu and host in test_bench_gpu / test_bench_helpers)."""

from __future__ import annotations

import importlib

import pytest

from solutions.__main__ import BENCHES

TOY_RUNS = {
    "decode": ["--tokens", "4", "--repeats", "1", "--prefill-tokens", "16", "--no-hf", "--no-bf16"],
    "quant": ["--tokens", "4", "--repeats", "1", "--ppl-tokens", "64"],
    "throughput": ["--num-requests", "2", "--max-num-seqs", "2", "--no-hf"],
    "kv": ["--requests", "20", "--rounds", "1", "--prefix-len", "64"],
    "spec": ["--max-tokens", "4", "--prompts", "1"],
    "tp": ["--batch", "1", "--prompt-tokens", "4", "--max-tokens", "4", "--repeats", "1"],
    "serving": ["--num-requests", "2", "--max-tokens", "2", "--no-offline", "--max-model-len", "256"],
}
ELSEWHERE = {"attention", "paged_attention", "kernels", "moe", "int4", "gpu", "host"}


def test_every_bench_command_is_run_by_a_test():
    assert set(TOY_RUNS) | ELSEWHERE == set(BENCHES)


@pytest.mark.parametrize("name", sorted(TOY_RUNS))
def test_bench_command_runs_on_toy_sizes(name, tmp_path, capsys):
    argv = TOY_RUNS[name] + (["--out", str(tmp_path / "serving")] if name == "serving" else [])
    assert importlib.import_module(f"solutions.cli.bench.{name}").main(argv) == 0
    assert capsys.readouterr().out.strip(), f"bench {name} printed nothing"
