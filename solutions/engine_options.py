"""Every ``EngineConfig`` field as a command-line flag, shared by the CLI, the server and the benchmarks."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from .config import EngineConfig

ENGINE_OPTION_HELP = {
    "model": "a .gguf file or a Hugging Face checkpoint folder (default: the bundled SmolLM2-135M-Instruct)",
    "device": "auto (CUDA if present, else CPU), cpu or cuda[:N]",
    "dtype": "auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16 or float16",
    "max_num_seqs": "most requests decoded together in one batch",
    "max_model_len": "context limit: prompt + output tokens per request",
    "max_num_batched_tokens": "most tokens (prefill chunks + decodes) in one step",
    "kv_cache_memory": "bytes of paged KV cache (default: a fixed budget on CPU, the free memory on CUDA)",
    "kv_block_size": "tokens per KV cache block, a power of two",
    "enable_prefix_caching": "reuse the KV blocks of a prompt prefix seen before",
    "gpu_memory_utilization": "fraction of GPU memory the engine may fill (weights + KV cache)",
    "attention_backend": "auto, torch or triton",
    "num_threads": "CPU threads for torch (default: torch's choice)",
    "quantization": "rtn or awq: pack the weights to --w-bit integers (Lesson 6)",
    "speculative_disable_by_batch_size": (
        "draft nothing in a step with more running requests than this (0: never)"
    ),
    "enforce_eager": "run every step eagerly (no CUDA graphs)",
    "async_scheduling": (
        "plan and launch each step before reading the previous one's tokens (default: on CUDA, off on CPU)"
    ),
    "tensor_parallel_size": (
        "processes the model is split across by heads, one per GPU (Lesson 9; default: 1)"
    ),
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """One flag per ``EngineConfig`` field
    (``max_num_seqs`` -> ``--max-num-seqs``), typed from its annotation."""
    group = parser.add_argument_group("engine options (EngineConfig fields)")
    hints = typing.get_type_hints(EngineConfig)
    for field in dataclasses.fields(EngineConfig):
        kind = hints[field.name]
        kinds = [k for k in typing.get_args(kind) if k is not type(None)] or [kind]
        default = field.default if field.default is not dataclasses.MISSING else None
        help_text = ENGINE_OPTION_HELP.get(field.name, field.name.replace("_", " "))
        if default is not None and "default" not in help_text:
            help_text += f" (default: {default})"
        flag = "--" + field.name.replace("_", "-")
        if kinds[0] is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            group.add_argument(flag, type=kinds[0], default=default, help=help_text)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EngineConfig`` keywords from parsed flags (``LLM(**engine_options(args))``)."""
    return {field.name: getattr(args, field.name) for field in dataclasses.fields(EngineConfig)}


def engine_argv(options: dict[str, Any]) -> list[str]:
    """The flags that reproduce ``options`` (the inverse of ``engine_options``; None values are left out)."""
    argv = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            argv += [flag, str(value)]
    return argv
