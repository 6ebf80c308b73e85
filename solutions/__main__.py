"""Command line: ``python -m solutions generate | chat | serve | perplexity | bench NAME | calibrate-awq |
moefy | train-eagle | eval``. The engine's own commands are here; a benchmark or a driver is one module of
``cli/``, imported by name when its command runs."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

from .engine_options import add_engine_args, engine_options
from .llm import LLM
from .quant.model import build_model
from .quant.perplexity import perplexity as perplexity_of
from .sampling_params import SamplingParams

BENCHES = {
    "decode": "batch-1 decode tokens/s: ours vs Hugging Face generate vs the roofline",
    "quant": "fp32 vs RTN vs AWQ: perplexity, weight bytes and batch-1 decode tokens/s",
    "int4": "the W4A16 Triton kernels on a GPU: GB/s of weight bytes vs copy bandwidth and bf16 F.linear",
    "moe": "a MoE layer: grouped expert GEMM vs per-expert loop vs a dense FFN of equal active size",
    "attention": "prefill attention: our FlashAttention-2 kernel vs torch SDPA flash vs naive (TFLOP/s)",
    "paged_attention": "paged decode GB/s vs copy bandwidth, batch-1 vs SDPA, varlen prefill vs SDPA (a GPU)",
    "kernels": "the fused layer ops vs the plain torch chains, and kernels per decode layer (a GPU)",
    "serving": "the HTTP server under load (Poisson arrivals or fixed concurrency): TTFT, TPOT, ITL, goodput",
    "throughput": (
        "offline throughput: continuous batching vs one-at-a-time vs HF static batches, vs the FLOP/s ceiling"
    ),
    "kv": (
        "KV memory reserved vs used and concurrent sequences, paged vs contiguous; TTFT with a cached prefix"
    ),
    "spec": "batch-1 speculative decoding: plain, n-gram, EAGLE and Medusa chains and trees (tokens/s, tau)",
    "host": "the engine's own work per decode step, the model taken out: us per step and per request",
    "gpu": "the engine on a GPU in one run: decode vs roofline and HF, step profile, batch sweep, throughput",
    "tp": (
        "tensor parallelism: tokens/s at N ranks, "
        "bytes all-reduced vs weight bytes per token, H200 prediction"
    ),
}
DRIVERS = {
    "calibrate-awq": ("calibrate_awq", "AWQ scales and clips for a model, written to data/awq/ (Lesson 6)"),
    "moefy": ("moefy", "split SmolLM2's FFNs into experts (MoEfication) and score each top-k (Lesson 5)"),
    "train-eagle": ("train_eagle", "train the EAGLE draft head by self-distillation (Lesson 4)"),
    "eval": ("eval", "multiple-choice accuracy by log-likelihood, float32 vs RTN vs AWQ (Lesson 6)"),
    "train-medusa": (
        "train_medusa",
        "train the Medusa heads on the EAGLE head's self-distilled data (Lesson 4)",
    ),
}


def _sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling options")
    group.add_argument(
        "--max-tokens", type=int, default=64, help="most tokens to generate per reply (default: 64)"
    )
    group.add_argument(
        "--temperature", type=float, default=0.0, help="0 is greedy (the default); 0.7 is lively"
    )
    group.add_argument(
        "--top-p", type=float, default=1.0, help="nucleus sampling: keep this much probability mass"
    )
    group.add_argument("--top-k", type=int, default=0, help="keep only the k likeliest tokens (0: all)")
    group.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    group.add_argument(
        "--stop", action="append", default=[], help="a string that ends the reply (repeatable)"
    )
    group.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-text token")


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_tokens=args.max_tokens,
        stop=args.stop,
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def _llm(args: argparse.Namespace) -> LLM:
    return LLM(**engine_options(args))


def generate(args: argparse.Namespace) -> int:
    llm = _llm(args)
    for output in llm.stream(args.prompt, _sampling(args)):
        print(output.outputs[0].delta_text, end="", flush=True)
    print(f"\n[{output.metrics.summary()}]")
    return 0


def chat(args: argparse.Namespace) -> int:
    llm = _llm(args)
    params = _sampling(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    print(
        "Chat with the model: type a message and press Enter. /reset starts over; "
        "an empty line or Ctrl-D quits."
    )
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            break
        if not line:
            break
        if line == "/reset":
            messages = list(system)
            continue
        messages.append({"role": "user", "content": line})
        prompt = llm.tokenizer.apply_chat_template(messages)
        print("model> ", end="")
        for output in llm.stream(prompt, params):
            print(output.outputs[0].delta_text, end="", flush=True)
        print(f"\n[{output.metrics.summary()}]")
        messages.append({"role": "assistant", "content": output.outputs[0].text})
    return 0


def serve(args: argparse.Namespace) -> int:
    # The HTTP stack (fastapi, uvicorn, pydantic, prometheus_client) loads only here: every other command,
    # `bench gpu` on a bare CUDA machine among them, runs without it (tests/test_bare_device.py).
    server = importlib.import_module(".serve.openai_server", __package__)
    server.run_server(
        engine_options(args),
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        served_model_name=args.served_model_name,
        log_level=args.log_level,
    )
    return 0


def perplexity(args: argparse.Namespace) -> int:
    model, tokenizer = build_model(args.quantization, args.w_bit, args.group_size)
    ids = torch.tensor(tokenizer.encode(Path(args.file).read_text())[: args.max_tokens])
    label = f"{args.quantization} INT{args.w_bit} g{args.group_size}" if args.quantization else "float32"
    print(f"{args.file}: {len(ids)} tokens, windows of {args.window}, weights {label}")
    print(f"perplexity: {perplexity_of(model, ids, args.window):.4f}")
    return 0


EXAMPLES = """examples:
  python -m solutions generate "The capital of France is" --max-tokens 16
  python -m solutions chat --temperature 0.7
  python -m solutions serve --port 8000            # then: curl localhost:8000/v1/models
  python -m solutions bench serving --help
  python -m solutions calibrate-awq --w-bit 4 --group-size 64
Every command takes the engine options (--device, --max-num-seqs, ...): \
see `python -m solutions serve --help`."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m solutions",
        description="The Fast Mode inference engine: generate, chat, serve the OpenAI API, run a benchmark, "
        "or make a lesson's artefact (AWQ scales, a MoE-fied model, the EAGLE head).",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gen = commands.add_parser("generate", help="complete one prompt, streaming, then print the metrics")
    gen.add_argument("prompt", help="the text to continue (plain text, no chat template)")
    _sampling_args(gen)
    add_engine_args(gen)
    talk = commands.add_parser(
        "chat", help="an interactive chat that keeps the conversation (the chat template)"
    )
    talk.add_argument("--system", default=None, help="a system message that opens the conversation")
    _sampling_args(talk)
    add_engine_args(talk)
    srv = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions)"
    )
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)"
    )
    srv.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    srv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes")
    srv.add_argument(
        "--served-model-name", default=None, help="the model id clients send (default: the file stem)"
    )
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_args(srv)
    ppl = commands.add_parser(
        "perplexity", help="perplexity of the bundled model on a text file, optionally quantized"
    )
    ppl.add_argument("--file", required=True, help="a UTF-8 text file, e.g. data/text/kjv_luke_1-12.txt")
    ppl.add_argument("--quantization", choices=["rtn", "awq"], default=None)
    ppl.add_argument("--w-bit", type=int, default=4)
    ppl.add_argument("--group-size", type=int, default=64)
    ppl.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens")
    ppl.add_argument("--window", type=int, default=512, help="tokens per independently scored window")
    # no -h of its own: `bench NAME --help` reaches that benchmark's parser, which lists its options
    bench = commands.add_parser("bench", help="benchmarks: " + ", ".join(BENCHES), add_help=False)
    bench.add_argument(
        "name", nargs="?", choices=sorted(BENCHES), help="; ".join(f"{k}: {v}" for k, v in BENCHES.items())
    )
    for name, (_, help_text) in DRIVERS.items():  # each parses its own options: `NAME --help` lists them
        commands.add_parser(name, help=help_text, add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        if args.name is None:  # `bench` or `bench --help`: which benchmarks there are
            bench.print_help()
            return 0 if {"-h", "--help"} & set(rest) else 2
        return importlib.import_module(f".cli.bench.{args.name}", __package__).main(rest)
    if args.command in DRIVERS:
        return importlib.import_module(f".cli.{DRIVERS[args.command][0]}", __package__).main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"generate": generate, "chat": chat, "serve": serve, "perplexity": perplexity}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
