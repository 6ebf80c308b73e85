"""Every ``python -m solutions bench NAME`` runs to the end on toy sizes (correctness of the script, never its
figures): the commands that other test files do not already run (attention, paged_attention, kernels, moe,
int4 with ``--smoke``; gpu and host in test_bench_gpu / test_bench_helpers). Each runs in its own process, as
a user runs it: in one process the seven commands' models and KV caches added up to 17 GB, which a CI worker
on a 24 GiB machine did not survive. Each runs with one matrix-product path forced (``FASTMODE_CPU_LINEAR``):
the engine otherwise keeps a copy of every weight per layout its measured paths use (up to three), and the
figures are not what these runs check."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from solutions.__main__ import BENCHES

TOY_RUNS = {
    "decode": ["--tokens", "4", "--repeats", "1", "--prefill-tokens", "16", "--no-hf", "--no-bf16"],
    "quant": ["--tokens", "4", "--repeats", "1", "--ppl-tokens", "64"],
    "throughput": ["--num-requests", "2", "--max-num-seqs", "2", "--max-tokens", "8", "--no-hf", "--split"],
    "kv": ["--requests", "20", "--rounds", "1", "--prefix-len", "64"],
    "spec": ["--max-tokens", "4", "--prompts", "1", "--rounds", "1", "--dtypes", "awq"],  # 3 engines, not 9
    "tp": ["--batch", "1", "--prompt-tokens", "4", "--max-tokens", "4", "--repeats", "1"],
    "serving": ["--num-requests", "2", "--max-tokens", "2", "--no-offline", "--max-model-len", "256"],
}
ELSEWHERE = {"attention", "paged_attention", "kernels", "moe", "int4", "gpu", "host"}
ONE_LAYOUT = os.environ | {"FASTMODE_CPU_LINEAR": "linear"}  # the weights as loaded: no second copy


def test_every_bench_command_is_run_by_a_test():
    assert set(TOY_RUNS) | ELSEWHERE == set(BENCHES)


@pytest.mark.parametrize("name", sorted(TOY_RUNS))
def test_bench_command_runs_on_toy_sizes(name, tmp_path):
    argv = TOY_RUNS[name] + (["--out", str(tmp_path / "serving")] if name == "serving" else [])
    run = subprocess.run(
        [sys.executable, "-m", "solutions", "bench", name, *argv],
        capture_output=True, text=True, timeout=600, env=ONE_LAYOUT,
    )  # fmt: skip
    assert run.returncode == 0, f"bench {name} exited {run.returncode}:\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), f"bench {name} printed nothing"


@pytest.mark.parametrize(
    "argv, verdict",
    [
        pytest.param(["decode", "--rows", "1,2", "--repeats", "1"], "awq int4", id="decode-rows"),
        pytest.param(
            ["spec", "--batch", "1,2", "--max-tokens", "4", "--rounds", "1"], "speculation", id="spec-batch"
        ),
    ],
)
def test_bench_row_and_batch_modes_run_on_toy_sizes(argv, verdict):
    """``bench decode --rows`` (a verify pass per row count, per dtype) and ``bench spec --batch`` (the
    speculation crossover) run to the end and print their verdict lines."""
    run = subprocess.run(
        [sys.executable, "-m", "solutions", "bench", *argv], capture_output=True, text=True, timeout=600,
        env=ONE_LAYOUT,
    )  # fmt: skip
    assert run.returncode == 0, f"bench {' '.join(argv)} exited {run.returncode}:\n{run.stderr[-3000:]}"
    assert verdict in run.stdout, f"bench {' '.join(argv)} printed no {verdict!r} line:\n{run.stdout[-2000:]}"
