"""What a ``bench gpu`` run measures with: how much (``Sizes``), and one shape's models, built on first use:
its checkpoint folder, this engine eager and with its default (CUDA graphs), and Hugging Face ``transformers``
on the same folder."""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..config import EngineConfig
from ..llm import LLM
from .gpu_report import Section
from .hf_peer import load_hf_model
from .model_shapes import SHAPES, write_bundled_checkpoint, write_random_checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CPU_KV_CACHE_BYTES = 256 << 20
ENGINES = ("eager", "graphs")
INT4_KV_CACHE_BYTES = 2 << 30


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each section measures."""

    copy_bytes: int
    copy_repeats: int
    decode_prompt: int
    decode_tokens: int
    decode_repeats: int
    step_prompt: int  # prompt length of the step profile's and the sweep's requests
    warmup_steps: int
    timed_steps: int
    profiled_steps: int
    profile_batches: tuple[int, ...]
    sweep_max_batch: int
    requests: int
    prompt_lens: tuple[int, int]
    output_lens: tuple[int, int]
    hf_batch: int
    spec_prompts: int
    spec_tokens: int


PRESETS = {  # field: (FULL, QUICK), side by side
    "copy_bytes": (2 << 30, 64 << 20), "copy_repeats": (10, 3),
    "decode_prompt": (32, 8), "decode_tokens": (128, 16), "decode_repeats": (3, 2),
    "step_prompt": (128, 16), "warmup_steps": (3, 2), "timed_steps": (20, 5), "profiled_steps": (10, 3),
    "profile_batches": ((1, 64), (1, 4)), "sweep_max_batch": (256, 8),
    "requests": (256, 16), "prompt_lens": ((100, 1024), (8, 48)), "output_lens": ((100, 1024), (8, 48)),
    "hf_batch": (64, 8), "spec_prompts": (4, 1), "spec_tokens": (96, 16),
}  # fmt: skip
FULL, QUICK = (Sizes(**{field: pair[i] for field, pair in PRESETS.items()}) for i in (0, 1))


LABELS = {
    "hf": "HF transformers generate",
    "int4": "this engine, INT4 W4A16 weights (RTN codes: AWQ's format and kernel), CUDA graphs",
    "eager": "this engine, enforce_eager=True",
}


def label(kind: str, device: str) -> str:
    graphs = " (CUDA graphs)" if device.startswith("cuda") else " (no graphs on a CPU)"
    return LABELS.get(kind, "this engine, enforce_eager=False" + graphs)


class ShapeModels:
    """One shape's checkpoint folder and, built on first use, its engines ("eager", "graphs") and HF model."""

    def __init__(self, name: str, folder: Path, device: str, sizes: Sizes, max_num_seqs: int):
        self.name, self.folder, self.device, self.sizes, self.max_num_seqs = (
            name,
            folder,
            device,
            sizes,
            max_num_seqs,
        )
        self.dtype = EngineConfig(device=device).dtype
        self.built: dict = {}

    def write(self, section: Section) -> None:
        start = time.perf_counter()
        if self.name == "bundled":
            _, self.shape = write_bundled_checkpoint(self.folder)
        else:
            self.shape = SHAPES[self.name]
            write_random_checkpoint(self.shape, self.folder, self.device)
        s = self.sizes
        longest = max(
            sum(r[1] for r in (s.prompt_lens, s.output_lens)),
            s.decode_prompt + s.decode_tokens,
            s.step_prompt + s.warmup_steps + s.timed_steps + s.profiled_steps,
        )
        self.max_model_len = min(self.shape.max_position_embeddings, longest + 16)
        self.kv_cache_bytes = self._kv_cache_bytes()
        weights = (
            "its Q4_1 weights dequantized to bfloat16"
            if self.name == "bundled"
            else "random bfloat16 weights"
        )
        section.out.update(
            shape=self.name, source=self.shape.source, config=self.shape.hf_config(), weights=weights,
            weight_bytes=self.shape.weight_bytes(), write_s=time.perf_counter() - start, dtype=self.dtype,
            kv_cache_bytes=self.kv_cache_bytes, max_model_len=self.max_model_len,
        )  # fmt: skip

    def _kv_cache_bytes(self) -> int:
        """On a GPU: what is left of 80% of its memory after three copies of the weights (two engines and HF)
        and HF's cache for one static batch, split between the two engines (2-40 GiB each)."""
        if not self.device.startswith("cuda"):
            return CPU_KV_CACHE_BYTES
        shape = self.shape
        total = torch.cuda.get_device_properties(torch.device(self.device)).total_memory
        hf_cache = self.sizes.hf_batch * self.max_model_len * 2 * shape.num_layers * shape.num_kv_heads
        hf_cache *= shape.head_dim * 2  # K and V, bfloat16
        each = (0.8 * total - 3 * shape.weight_bytes() - hf_cache) / 2
        return int(min(max(each, 2 << 30), 40 << 30))

    def llm(self, kind: str) -> LLM:
        if kind not in self.built:
            # The INT4 engine only decodes one sequence: a small cache leaves room for the other three models.
            self.built[kind] = LLM(
                model=str(self.folder), skip_tokenizer_init=True, device=self.device,
                max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len,
                kv_cache_memory=INT4_KV_CACHE_BYTES if kind == "int4" else self.kv_cache_bytes,
                enforce_eager=kind == "eager", quantization="rtn" if kind == "int4" else None,
            )  # fmt: skip
        return self.built[kind]

    def hf(self) -> PreTrainedModel:
        if "hf" not in self.built:
            self.built["hf"] = load_hf_model(self.folder, getattr(torch, self.dtype), self.device)
        return self.built["hf"]

    def release(self, *kinds: str) -> None:
        for kind in kinds or list(self.built):
            self.built.pop(kind, None)
        gc.collect()
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()

    def batches(self, wanted: Iterable[int]) -> list[int]:
        return [b for b in wanted if b <= self.max_num_seqs]
