"""Command line: ``python -m solutions generate | chat | bench NAME``."""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES = {
    "decode": "batch-1 decode tokens/s: ours vs Hugging Face generate vs the roofline",
    "quant": "fp32 vs RTN vs AWQ: perplexity, weight bytes and batch-1 decode tokens/s",
    "attention": "prefill attention: our FlashAttention-2 kernel vs torch SDPA flash vs naive (TFLOP/s)",
    "throughput": "offline throughput: continuous batching vs one-at-a-time vs HF static batches, vs the FLOP/s ceiling",
    "spec": "batch-1 speculative decoding: plain vs n-gram vs EAGLE chain vs EAGLE tree (tokens/s, tau)",
}


def _sampling(args):
    from .engine.sampling_params import SamplingParams

    return SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens, seed=args.seed
    )


def _engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="a .gguf file or HF checkpoint folder (default: bundled SmolLM2)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)


def _llm(args):
    from .llm import LLM

    return LLM(args.model, device=args.device, dtype=args.dtype)


def generate(args) -> int:
    llm = _llm(args)
    for output in llm.stream(args.prompt, _sampling(args)):
        print(output.outputs[0].delta_text, end="", flush=True)
    print(f"\n[{output.metrics.summary()}]")
    return 0


def chat(args) -> int:
    llm = _llm(args)
    messages: list[dict[str, str]] = []
    print("Chat with the model (empty line or Ctrl-D to quit).")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        prompt = llm.tokenizer.apply_chat_template(messages)
        print("model> ", end="")
        for output in llm.stream(prompt, _sampling(args)):
            print(output.outputs[0].delta_text, end="", flush=True)
        print(f"\n[{output.metrics.summary()}]")
        messages.append({"role": "assistant", "content": output.outputs[0].text})
    return 0


def perplexity(args) -> int:
    from pathlib import Path

    import torch

    from .quant.model import build_model
    from .quant.perplexity import perplexity as score

    model, tokenizer = build_model(args.quantization, args.w_bit, args.group_size)
    ids = torch.tensor(tokenizer.encode(Path(args.file).read_text())[: args.max_tokens])
    label = f"{args.quantization} INT{args.w_bit} g{args.group_size}" if args.quantization else "float32"
    print(f"{args.file}: {len(ids)} tokens, windows of {args.window}, weights {label}")
    print(f"perplexity: {score(model, ids, args.window):.4f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m solutions", description="The Fast Mode inference engine.")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="complete one prompt, streaming, then print the metrics")
    gen.add_argument("prompt")
    _engine_args(gen)
    _engine_args(commands.add_parser("chat", help="an interactive chat using the model's chat template"))
    ppl = commands.add_parser("perplexity", help="perplexity of the bundled model on a text file, optionally quantized")
    ppl.add_argument("--file", required=True, help="a UTF-8 text file, e.g. data/text/kjv_luke_1-12.txt")
    ppl.add_argument("--quantization", choices=["rtn", "awq"], default=None)
    ppl.add_argument("--w-bit", type=int, default=4)
    ppl.add_argument("--group-size", type=int, default=64)
    ppl.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens")
    ppl.add_argument("--window", type=int, default=512, help="tokens per independently scored window")
    bench = commands.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES))
    bench.add_argument("name", choices=sorted(BENCHES), help="; ".join(f"{k}: {v}" for k, v in BENCHES.items()))
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return importlib.import_module(f".bench.{args.name}", __package__).main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"generate": generate, "chat": chat, "perplexity": perplexity}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
