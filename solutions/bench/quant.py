"""``python -m solutions bench quant``: fp32 vs RTN vs AWQ on the bundled model, side by side in one run.

Three figures per setting: perplexity on the evaluation text (``data/text``), the bytes of weights the
model holds (every tensor once; the tied embedding / LM head is one matrix), and batch-1 greedy decode
tokens/s measured as in ``bench decode`` (repeats alternate between engines; medians). On CPU the
quantized engines use torch's int4 kernel (``aten._weight_int4pack_mm_for_cpu``). With ``llama-cpp-python``
installed, llama.cpp on the same Q4_1 file joins as a peer. On a CUDA machine a last table times the
Triton W4A16 GEMV against a float16 matrix-vector product for each of the model's weight shapes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .decode import PROMPT, decode_speeds

EVAL_TEXT = Path(__file__).resolve().parents[2] / "data" / "text" / "kjv_luke_1-12.txt"
SETTINGS = {"fp32": None, "RTN": "rtn", "AWQ": "awq"}


def _llama_cpp_runner(threads: int):
    """A decode runner for llama.cpp on the bundled Q4_1 file, or None when llama-cpp-python is absent."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from ..model.loader import bundled_model_path

    llama = Llama(str(bundled_model_path()), n_threads=threads, n_ctx=512, verbose=False)
    ids = llama.tokenize(PROMPT.encode())

    def run(n: int) -> None:
        llama.reset()
        for i, _ in enumerate(llama.generate(ids, temp=0.0)):
            if i + 1 >= n:
                break

    return run


def _gpu_table(w_bit: int, group_size: int) -> None:
    """Triton W4A16 GEMV vs a float16 GEMV at batch 1, per weight shape of the model (CUDA only)."""
    import triton

    from ..kernels.awq_gemm import awq_gemm
    from ..quant.pack import pack_int4
    from ..quant.rtn import quantize

    print(f"\nGPU ({torch.cuda.get_device_name()}), batch-1 GEMV, median of triton.testing.do_bench:")
    print(f"{'shape N x K':<16}{'fp16 us':>10}{'W4A16 us':>10}{'speed-up':>10}{'W4A16 GB/s':>12}")
    for n, k in [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 576), (14336, 4096)]:
        weight = torch.randn(n, k, device="cuda", dtype=torch.float16)
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        g = quantize(weight, w_bit, group_size)
        qweight, scales = pack_int4(g.q), g.scales.half()
        fp16 = triton.testing.do_bench(lambda x=x, weight=weight: x @ weight.T)
        w4 = triton.testing.do_bench(lambda x=x, g=g, q=qweight, s=scales: awq_gemm(x, q, s, g.zeros, group_size))
        nbytes = qweight.nbytes + scales.nbytes + g.zeros.nbytes
        print(f"{f'{n} x {k}':<16}{fp16 * 1e3:>10.1f}{w4 * 1e3:>10.1f}{fp16 / w4:>9.2f}x{nbytes / w4 / 1e6:>12.0f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions bench quant", description=__doc__.splitlines()[0])
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=64)
    parser.add_argument("--ppl-tokens", type=int, default=None, help="score only the first N tokens (default: all)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per decode measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)

    from ..engine.sampling_params import SamplingParams
    from ..llm import LLM
    from ..quant.model import weight_bytes
    from ..quant.perplexity import perplexity

    torch.set_num_threads(args.threads)
    quant = dict(w_bit=args.w_bit, group_size=args.group_size)
    llms = {
        name: LLM(
            device="cpu", dtype="float32", max_num_seqs=1, max_model_len=args.tokens + 64, quantization=method, **quant
        )
        for name, method in SETTINGS.items()
    }
    fp16_bytes = 2 * sum(p.numel() for p in llms["fp32"].engine.model.parameters())
    ids = torch.tensor(llms["fp32"].tokenizer.encode(EVAL_TEXT.read_text())[: args.ppl_tokens])
    ppl = {name: perplexity(llm.engine.model, ids) for name, llm in llms.items()}

    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    runs = {name: (lambda n, llm=llm: llm.generate(PROMPT, greedy(n))) for name, llm in llms.items()}
    peer = _llama_cpp_runner(args.threads)
    if peer is not None:
        runs["llama.cpp Q4_1 (peer)"] = peer
    speeds = decode_speeds(runs, args.tokens, args.repeats)

    print(f"machine: {args.threads} CPU threads, torch {torch.__version__}; INT{args.w_bit} g{args.group_size}")
    print(f"perplexity: {EVAL_TEXT.name}, first {len(ids)} tokens, windows of 512")
    print(f"decode: batch 1, greedy, {args.tokens} tokens, median of {args.repeats}")
    print("'fp32' is the bundled Q4_1 GGUF dequantized to float32 (the reference every setting is compared with)")
    print(f"{'setting':<24}{'perplexity':>11}{'gap':>8}{'weight MB':>11}{'vs fp16':>9}{'tokens/s':>10}{'vs fp32':>9}")
    for name, speed in speeds.items():
        if name in llms:
            nbytes = weight_bytes(llms[name].engine.model)
            row = f"{ppl[name]:>11.3f}{ppl[name] - ppl['fp32']:>+8.3f}{nbytes / 1e6:>11.1f}{nbytes / fp16_bytes:>8.2f}x"
        else:
            row = f"{'-':>11}{'-':>8}{'-':>11}{'-':>9}"
        print(f"{name:<24}{row}{speed:>10.1f}{speed / speeds['fp32']:>8.2f}x")
    if peer is None:
        print("llama.cpp peer: not installed (pip install llama-cpp-python builds it in a few minutes)")
    gap = {k: ppl[k] - ppl["fp32"] for k in ("RTN", "AWQ")}
    print(f"AWQ's perplexity gap is {gap['AWQ'] / gap['RTN']:.2f} of RTN's (goal <= 0.5; paper, Llama-2-7B g128: 0.50)")
    if torch.cuda.is_available():
        _gpu_table(args.w_bit, args.group_size)
    return 0
