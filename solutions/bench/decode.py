"""``python -m solutions bench decode``: batch-1 greedy decode speed, ours vs Hugging Face ``generate``
on the same weights, beside the roofline, measured side by side in one run.

Decode speed is (time for N tokens - time for 1 token) / (N - 1) for both engines, so prefill and
start-up costs cancel and both are measured the same way. Repeats alternate between the engines
(this machine is noisy) and the median is reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

PROMPT = "The history of the printing press begins"


def _hf_generate(model, ids: torch.Tensor, new_tokens: int) -> None:
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=2)


def decode_speeds(runs: dict, new_tokens: int, repeats: int) -> dict[str, float]:
    """Median decode tokens/s of each ``runs[name](n)`` (generates n tokens), measured alternately:
    each repeat runs every engine once, so drifts in machine speed hit them all alike."""
    for run in runs.values():
        run(8)  # warm up
    figures: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            figures[name] += seconds_per_decode_token(run, new_tokens, 1)
    return {name: 1 / statistics.median(f) for name, f in figures.items()}


def seconds_per_decode_token(run, new_tokens: int, repeats: int) -> list[float]:
    """One figure per repeat: (t(new_tokens) - t(1)) / (new_tokens - 1)."""
    figures = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(1)
        one = time.perf_counter() - start
        start = time.perf_counter()
        run(new_tokens)
        figures.append((time.perf_counter() - start - one) / (new_tokens - 1))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions bench decode", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face comparison")
    args = parser.parse_args(argv)

    from ..engine.sampling_params import SamplingParams
    from ..llm import LLM
    from ..model.loader import bundled_model_path
    from .roofline import decode_bytes_per_token, measure_read_bandwidth

    dtype = getattr(torch, args.dtype)
    llm = LLM(device="cpu", dtype=args.dtype, max_num_seqs=1, max_model_len=args.tokens + 64)
    ours = lambda n: llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    runs = {"fast-mode engine": ours}
    if not args.no_hf:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging

        logging.set_verbosity_error()
        path = bundled_model_path()
        hf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
        ids = torch.tensor([llm.tokenizer.encode(PROMPT)])
        runs["HF transformers generate"] = lambda n: _hf_generate(hf_model, ids, n)
    speeds = decode_speeds(runs, args.tokens, args.repeats)
    bandwidth = measure_read_bandwidth()
    weight_bytes = decode_bytes_per_token(llm.engine.model)
    roofline = bandwidth / weight_bytes
    print(f"machine: {torch.get_num_threads()} CPU threads, torch {torch.__version__}, weights {args.dtype}")
    print(f"read bandwidth (sum of a 1 GiB buffer): {bandwidth / 1e9:.1f} GB/s")
    print(f"weight bytes read per decode token: {weight_bytes / 1e6:.1f} MB -> roofline {roofline:.1f} tokens/s")
    print(f"batch-1 greedy decode, {args.tokens} tokens, median of {args.repeats}:")
    print(f"{'engine':<26}{'tokens/s':>10}{'ms/token':>10}{'of roofline':>13}{'vs HF':>8}")
    hf_speed = speeds.get("HF transformers generate")
    for name, speed in speeds.items():
        vs_hf = f"{speed / hf_speed:.2f}x" if hf_speed else "-"
        print(f"{name:<26}{speed:>10.1f}{1e3 / speed:>10.1f}{speed / roofline:>12.0%}{vs_hf:>8}")
    return 0
