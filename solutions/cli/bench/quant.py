"""``python -m solutions bench quant``: fp32 vs RTN vs AWQ on the bundled model, side by side in one run.

Three figures per setting: perplexity on the evaluation text (``data/text``), the bytes of weights the
model holds (every tensor once; the tied embedding / LM head is one matrix), and batch-1 greedy decode
tokens/s measured as in ``bench decode`` (repeats alternate between engines; medians). On CPU the
quantized engines use torch's int4 kernel (``aten._weight_int4pack_mm_for_cpu``). With ``llama-cpp-python``
installed, llama.cpp on the same Q4_1 file joins as a peer. The AWQ engine's decode step is then taken apart
as ``bench decode`` does it (``step_split``: matrix products, attention, elementwise, sampler, Python/other;
its layers compiled whole, ``quant/cpu_int4_layer.py``, are one part, and the same engine with its layers
run module by module is timed beside it).
On a CUDA machine a last table times the Triton W4A16 GEMV against a bfloat16 one for each of the model's
weight shapes (``bench int4``'s table at one row).
"""

from __future__ import annotations

import torch

from ...bench.decode import LLAMA_CPP_MISSING, PROMPT, decode_speeds, llama_cpp_runner, modules_run
from ...bench.machine import machine_name
from ...bench.model_shapes import SHAPES
from ...bench.step_split import linear_seconds, measure_step_split, split_lines
from ...llm import LLM
from ...paths import DATA_DIR
from ...quant.model import weight_bytes
from ...quant.perplexity import perplexity
from ...sampling_params import SamplingParams
from . import bench_parser, int4

TEXT_DIR = DATA_DIR / "text"
# Evaluation texts of three genres, none used in AWQ's calibration (data/text/README.md).
EVAL_TEXTS = {
    "Luke (KJV)": TEXT_DIR / "kjv_luke_1-12.txt",
    "Python reference": TEXT_DIR / "eval_python_reference.txt",
    "Python code": TEXT_DIR / "eval_python_code.txt",
}
SETTINGS = {"fp32": None, "RTN": "rtn", "AWQ": "awq"}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__name__, __doc__.splitlines()[0])
    add = parser.add_argument
    add("--w-bit", type=int, default=4, help="bits per quantized weight")
    add("--group-size", type=int, default=64, help="weights sharing one scale and zero point")
    add("--ppl-tokens", type=int, default=4096, help="score the first N tokens of each text")
    add(
        "--activations",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="INT4 engines' activations",
    )
    add("--tokens", type=int, default=64, help="tokens generated per decode measurement")
    add("--repeats", type=int, default=3)
    add("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    quant = dict(w_bit=args.w_bit, group_size=args.group_size)
    engine = dict(device="cpu", max_num_seqs=1, max_model_len=args.tokens + 64, **quant)
    activations = {"fp32": "float32", "RTN": args.activations, "AWQ": args.activations}
    llms = {
        name: LLM(dtype=activations[name], quantization=method, **engine) for name, method in SETTINGS.items()
    }
    fp16_bytes = 2 * sum(p.numel() for p in llms["fp32"].engine.model.parameters())
    encode = llms["fp32"].tokenizer.encode
    texts = {
        label: torch.tensor(encode(path.read_text())[: args.ppl_tokens]) for label, path in EVAL_TEXTS.items()
    }
    ppl = {
        (label, name): perplexity(llm.engine.model, ids)
        for label, ids in texts.items()
        for name, llm in llms.items()
    }

    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    runs = {name: (lambda n, llm=llm: llm.generate(PROMPT, greedy(n))) for name, llm in llms.items()}
    if llms["AWQ"].engine.model.fused_decode is not None:  # the same engine, its layers as modules
        runs["AWQ, modules"] = modules_run(llms["AWQ"], PROMPT, greedy)
    peer = llama_cpp_runner(args.threads)
    if peer is not None:
        runs["llama.cpp Q4_1 (peer)"] = peer
    speeds = decode_speeds(runs, args.tokens, args.repeats)
    awq_model = llms["AWQ"].engine.model
    awq_linears_s = linear_seconds(awq_model, rows=1)
    awq_split = measure_step_split(llms["AWQ"], PROMPT, min(args.tokens, 64), args.repeats)

    print(f"machine: {machine_name('cpu')}, torch {torch.__version__}; INT{args.w_bit} g{args.group_size}")
    print(
        f"INT4 engines: activations {args.activations} (torch's CPU int4 kernel computes in bfloat16)\n"
        "'fp32' is the bundled Q4_1 GGUF dequantized to float32 (the reference every setting is compared "
        f"with)\nperplexity, first {args.ppl_tokens} tokens of each text, windows of 512 (none of them used "
        "in calibration):"
    )
    print(f"{'text':<20}{'fp32':>9}{'RTN':>9}{'AWQ':>9}{'RTN gap':>9}{'AWQ gap':>9}{'AWQ/RTN':>9}")
    for label in texts:
        fp32, rtn, awq = (ppl[(label, name)] for name in SETTINGS)
        ratio = (awq - fp32) / (rtn - fp32) if rtn != fp32 else float("nan")
        gaps = f"{rtn - fp32:>+9.3f}{awq - fp32:>+9.3f}{ratio:>9.2f}"
        print(f"{label:<20}{fp32:>9.3f}{rtn:>9.3f}{awq:>9.3f}{gaps}")
    print(
        "goal: AWQ's gap <= 0.5 of RTN's on each text (paper, Llama-2-7B g128: 0.50)\n"
        f"decode: batch 1, greedy, {args.tokens} tokens, median of {args.repeats}, engines alternating\n"
        f"{'setting':<24}{'weight MB':>11}{'vs fp16':>9}{'tokens/s':>10}{'vs fp32':>9}"
    )
    for name, speed in speeds.items():
        if name in llms:
            nbytes = weight_bytes(llms[name].engine.model)
            row = f"{nbytes / 1e6:>11.1f}{nbytes / fp16_bytes:>8.2f}x"
        else:
            row = f"{'-':>11}{'-':>9}"
        print(f"{name:<24}{row}{speed:>10.1f}{speed / speeds['fp32']:>8.2f}x")
    if peer is None:
        print(LLAMA_CPP_MISSING)
    else:
        print(
            f"AWQ INT4 vs llama.cpp Q4_1: {speeds['AWQ'] / speeds['llama.cpp Q4_1 (peer)']:.2f}x (goal >= 1)"
        )
    step = 1 / speeds["AWQ"]
    nbytes = weight_bytes(awq_model)
    layers = type(awq_model.fused_decode).__name__ if awq_model.fused_decode is not None else "modules"
    print(
        f"where an AWQ decode step goes (layers: {layers}; layer ops: {awq_model.ops.name}; timed by part):"
    )
    print("\n".join(split_lines(awq_split, awq_linears_s * 1e3, step * 1e3)))
    print(
        f"the INT4 linears alone read {nbytes / awq_linears_s / 1e9:.1f} GB/s of packed weights; "
        f"step {step / awq_linears_s:.2f}x its matrix products alone"
    )
    if torch.cuda.is_available():  # the W4A16 kernel against a dense GEMV, this model's shapes at batch 1
        print("\n" + "\n".join(int4.table(SHAPES["smollm2-135m"], [1], args.group_size, "cuda")))
    return 0
