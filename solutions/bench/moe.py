"""What ``python -m solutions bench moe`` measures with (``cli/bench/moe.py``; notebooks 05 and 07 use the
same): a random MoE layer (8 experts, top-2, SwiGLU experts of width ``I``), the three ways to compute it
(the engine's grouped path, Hugging Face Mixtral's per-expert loop, a dense SwiGLU FFN of width ``k * I`` with
the same active parameters), and the GPU table of the grouped Triton kernel against the loop."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.moe_gemm import fused_moe, fused_moe_triton, moe_per_expert_loop
from ..model.moe_router import route
from .machine import machine_name
from .timing import median_ms, timer_name

NUM_EXPERTS, TOP_K = 8, 2
GPU_SHAPES = [(4096, 14336), (2048, 1408), (1024, 2816)]  # (H, I): Mixtral-8x7B's experts, two small ones
GPU_GOAL = 2.0  # the grouped kernel vs the per-expert loop, at every shape


def make_layer(
    hidden: int, width: int, device: str, dtype: torch.dtype, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Router, stacked experts, and a dense FFN with the experts' active width ``TOP_K * width``, drawn on
    ``device`` (a 4096 x 14336 layer is 3.5 GB of bfloat16: no host copy)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape: int, fan_in: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=dtype) / fan_in**0.5).to(dtype)

    return {
        "router": rand(NUM_EXPERTS, hidden, fan_in=hidden),
        "w13": rand(NUM_EXPERTS, 2 * width, hidden, fan_in=hidden),
        "w2": rand(NUM_EXPERTS, hidden, width, fan_in=width),
        "dense_w13": rand(2 * TOP_K * width, hidden, fan_in=hidden),
        "dense_w2": rand(hidden, TOP_K * width, fan_in=TOP_K * width),
    }


def runners(layer: dict[str, torch.Tensor], grouped: Callable[..., torch.Tensor] = fused_moe) -> dict:
    """The three implementations, router included; ``grouped`` is called as the engine calls it (no id
    check, no host sync)."""

    def moe(x: torch.Tensor, impl: Callable[..., torch.Tensor]) -> torch.Tensor:
        routing = route(x @ layer["router"].t(), TOP_K)
        return impl(x, layer["w13"], layer["w2"], routing.weights.to(x.dtype), routing.experts)

    def dense(x: torch.Tensor) -> torch.Tensor:
        gate, up = (x @ layer["dense_w13"].t()).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ layer["dense_w2"].t()

    return {
        "grouped (engine path)": lambda x: moe(x, lambda *a: grouped(*a, check_ids=False)),
        "per-expert loop": lambda x: moe(x, moe_per_expert_loop),
        "dense FFN, same active": dense,
    }


def kernel_table(shapes: list[tuple[int, int]], tokens: int, device: str) -> list[str]:
    """The grouped Triton kernel vs the loop vs the dense FFN, bfloat16, at each (H, I): ms, TFLOP/s, ratio
    to the loop beside the goal. On a CPU (``--smoke``) it runs through the interpreter: a check, not a
    timing."""
    name = torch.cuda.get_device_name() if device == "cuda" else f"{machine_name('cpu')} (Triton interpreter)"
    lines = [f"{name}, bf16, {NUM_EXPERTS} experts, top-{TOP_K}, {tokens} tokens; "
             f"{timer_name(device, 3)}"]  # fmt: skip
    lines.append(f"{'H x I':<14}{'impl':<26}{'ms':>9}{'TFLOP/s':>9}{'vs loop':>9}   max rel. err vs loop")
    verdicts = []
    for hidden, width in shapes:
        layer = make_layer(hidden, width, device, torch.bfloat16)
        fns = runners(layer, grouped=fused_moe_triton)
        x = torch.randn(tokens, hidden, device=device, dtype=torch.bfloat16)
        with torch.inference_mode():
            loop_out = fns["per-expert loop"](x).float()
            grouped_out = fns["grouped (engine path)"](x).float()  # the first call autotunes
            ms = {impl: median_ms(lambda fn=fn, x=x: fn(x), device, 3) for impl, fn in fns.items()}
        err = (grouped_out - loop_out).abs().max() / loop_out.abs().max()
        work = 2 * tokens * TOP_K * 3 * hidden * width
        for impl, t in ms.items():
            note = f"   {err:.1e}" if impl.startswith("grouped") else ""
            row = f"{f'{hidden} x {width}':<14}{impl:<26}{t:>9.3f}{work / t / 1e9:>9.1f}"
            lines.append(f"{row}{ms['per-expert loop'] / t:>8.2f}x{note}")
        ratio = ms["per-expert loop"] / ms["grouped (engine path)"]
        needed = GPU_GOAL * work / ms["per-expert loop"] / 1e9
        verdict = "met" if ratio >= GPU_GOAL else "not met"
        verdicts.append(
            f"{hidden} x {width}: {ratio:.2f}x, {verdict} ({GPU_GOAL:g}x the loop needs {needed:.0f} TFLOP/s)"
        )
        del layer, fns
    lines.append(f"goal: grouped >= {GPU_GOAL:g}x the per-expert loop at every shape; " + "; ".join(verdicts))
    return lines
