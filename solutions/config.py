"""Every engine option in one validated dataclass."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from .kernels.cpu_linear import native_bf16

ATTENTION_BACKENDS = ("auto", "torch", "triton")
QUANTIZATION_METHODS = ("rtn", "awq")
SPECULATIVE_METHODS = ("ngram", "eagle", "medusa")


@dataclass
class EngineConfig:
    """``device`` "auto" picks CUDA when present, else CPU; ``dtype`` "auto" is bfloat16 on CUDA, float32 on
    CPU (bfloat16 for a quantized model on a CPU with native bfloat16, where it is measured faster).

    Scheduling (Lesson 3): each step runs at most ``max_num_seqs`` sequences and ``max_num_batched_tokens``
    tokens (default 512 on CPU, 8192 on CUDA), prompts chunked to fit; no sequence exceeds ``max_model_len``.
    KV cache (Lesson 2): ``kv_cache_memory`` bytes of paged blocks of ``kv_block_size`` tokens (default on CPU
    1 GiB; on CUDA ``gpu_memory_utilization`` of the memory left after the weights), with automatic prefix
    caching unless ``enable_prefix_caching`` is False.
    ``attention_backend`` "auto" picks the attention implementation at each call (``$FASTMODE_ATTENTION``,
    else Triton on CUDA and torch on a CPU: ``kernels/attention_backend.py``); the engine turns it into
    "torch" on CUDA for a model whose head dim the Triton kernels do not tile. CUDA graphs (decode steps, and
    steps verifying draft chains) need the Triton backend.
    ``quantization`` "rtn" or "awq" packs every linear and the LM head to ``w_bit``-bit codes in groups of
    ``group_size`` input channels (Lesson 6);
    AWQ reads scales cached by ``python -m solutions calibrate-awq``.
    ``skip_tokenizer_init`` loads no tokenizer (a folder without tokenizer files): prompts must be token ids,
    and outputs carry token ids with empty text.
    ``speculative`` "ngram", "eagle" or "medusa" drafts ``num_speculative_tokens`` tokens per request and step
    for the model to verify (Lesson 4); with "eagle" or "medusa", ``speculative_tree_nodes > 0`` drafts trees
    of that many nodes (depth ``num_speculative_tokens``, ``speculative_tree_top_k`` expanded per depth)
    instead of chains; ``eagle_head`` / ``medusa_heads`` is the drafter's file (default: the one shipped in
    data/spec/). ``speculative_disable_by_batch_size`` N > 0 drafts nothing in a step where more than N
    requests are running (vLLM's option of that name): there a verify pass's extra rows cost more than the
    accepted drafts save (``bench spec --batch`` measures the crossover); 0 always drafts.
    ``tensor_parallel_size`` N > 1 splits the model by heads across N processes (Lesson 9: gloo on CPU, NCCL
    on cuda:0 .. cuda:N-1); every rank holds ``kv_cache_memory`` of its own KV heads. CUDA graphs stay off
    under it, and speculative decoding and MoE models are not supported with it.
    ``async_scheduling`` (overlap scheduling; default: on CUDA, off on a CPU, where the device is the host and
    nothing would overlap) plans and launches step N+1 before the host reads step N's tokens: the host's
    view runs one step behind (``engine.py``). A step that speculates, wants log-probabilities or runs
    under tensor parallelism is read back before the next one is planned.
    """

    model: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 32
    max_model_len: int = 2048
    max_num_batched_tokens: int | None = None
    kv_cache_memory: int | None = None
    kv_block_size: int = 16
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    attention_backend: str = "auto"
    num_threads: int | None = None
    quantization: str | None = None
    w_bit: int = 4
    group_size: int = 64
    skip_tokenizer_init: bool = False
    speculative: str | None = None
    num_speculative_tokens: int = 4
    speculative_tree_nodes: int = 0
    speculative_tree_top_k: int = 4
    speculative_disable_by_batch_size: int = 0
    eagle_head: str | None = None
    medusa_heads: str | None = None
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        self._resolve_device()
        self._check_scheduling_and_cache()
        self._check_methods()
        if self.tensor_parallel_size > 1:
            self._check_tensor_parallel()
        if self.async_scheduling is None:
            self.async_scheduling = self.device.startswith("cuda") and self.tensor_parallel_size == 1

    def _resolve_device(self) -> None:
        """``device`` and ``dtype`` from "auto" to what this machine has."""
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} was asked for, but torch sees no CUDA GPU")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if self.dtype == "auto":
            on_cuda = self.device.startswith("cuda")
            self.dtype = "bfloat16" if on_cuda or self._int4_on_native_bf16_cpu() else "float32"
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got {self.dtype!r}")

    def _check_scheduling_and_cache(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 8192 if self.device.startswith("cuda") else 512
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.kv_block_size < 1 or self.kv_block_size & (self.kv_block_size - 1):
            raise ValueError(f"kv_block_size must be a power of two, got {self.kv_block_size}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise ValueError(
                f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    def _check_methods(self) -> None:
        """The attention backend, quantization and speculative decoding options."""
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}"
            )
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # read when a kernel module is imported
        if self.attention_backend == "triton" and self.device == "cpu" and not interpreted:
            raise ValueError(
                "attention_backend='triton' on a CPU runs the kernels through Triton's interpreter, "
                "which this process did not choose: set TRITON_INTERPRET=1 before importing solutions "
                "(a machine without a GPU sets it by itself)"
            )
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(
                f"quantization must be None or one of {QUANTIZATION_METHODS}, got {self.quantization!r}"
            )
        if self.w_bit not in (2, 3, 4):
            raise ValueError(f"w_bit must be 2, 3 or 4 (codes are stored in 4-bit fields), got {self.w_bit}")
        if self.group_size < 8 or self.group_size % 8:
            raise ValueError(f"group_size must be a positive multiple of 8, got {self.group_size}")
        if self.speculative is not None and self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative must be None or one of {SPECULATIVE_METHODS}, got {self.speculative!r}"
            )
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be an integer >= 1, got {self.num_speculative_tokens!r}"
            )
        if self.speculative_tree_nodes < 0 or self.speculative_tree_top_k < 1:
            raise ValueError(
                f"speculative_tree_nodes must be >= 0 and speculative_tree_top_k >= 1, got "
                f"{self.speculative_tree_nodes} and {self.speculative_tree_top_k}"
            )
        if (
            not isinstance(self.speculative_disable_by_batch_size, int)
            or self.speculative_disable_by_batch_size < 0
        ):
            raise ValueError(
                "speculative_disable_by_batch_size must be an integer >= 0 (0: never disable), got "
                f"{self.speculative_disable_by_batch_size!r}"
            )
        if self.speculative_tree_nodes and self.speculative not in ("eagle", "medusa"):
            raise ValueError(
                f"draft trees need speculative='eagle' or 'medusa', got speculative={self.speculative!r}"
            )
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            raise ValueError(
                f"tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}"
            )

    def _check_tensor_parallel(self) -> None:
        """What tensor parallelism does not support in this version fails here, before any process starts."""
        size = self.tensor_parallel_size
        if self.speculative is not None:
            raise ValueError(
                f"speculative decoding ({self.speculative!r}) is not supported with "
                f"tensor_parallel_size={size}"
            )
        if self.device.startswith("cuda"):
            if self.device not in ("cuda", "cuda:0"):
                raise ValueError(
                    f"tensor parallelism runs rank r on cuda:r: give device 'cuda', not {self.device!r}"
                )
            if torch.cuda.device_count() < size:
                raise ValueError(
                    f"tensor_parallel_size={size} needs {size} GPUs (one per rank), torch sees "
                    f"{torch.cuda.device_count()}"
                )
            if not self.enforce_eager:
                logging.getLogger("fastmode").warning(
                    "CUDA graphs are off under tensor parallelism (tensor_parallel_size=%d): "
                    "every step runs eagerly",
                    size,
                )
                self.enforce_eager = True

    def _int4_on_native_bf16_cpu(self) -> bool:
        """Quantized on a CPU that computes bfloat16 natively: torch's int4 kernel takes bfloat16 activations
        only (float32 ones fall to a path ~30x slower), so bfloat16 activations spare two casts per linear."""
        return self.quantization is not None and self.device == "cpu" and native_bf16()

    @property
    def max_logits_rows(self) -> int:
        """The most logits rows a step wants: per sequence its newest token's, and one per draft it
        verifies (a chain's tokens or a tree's nodes); at most a step's tokens."""
        drafts = 0 if self.speculative is None else self.speculative_tree_nodes or self.num_speculative_tokens
        return min(self.max_num_seqs * (1 + drafts), self.max_num_batched_tokens)

    @property
    def max_graph_rows(self) -> int:
        """The largest decode graph's bucket: the most tokens a step replayed from a graph holds, each a
        sequence of its own that wants its logits (a decode per sequence, or with draft chains the newest
        token and its chain; trees verify eagerly). Named for the graph's rows (of its inputs and logits);
        the name stays, as tests, notebooks and benches read it."""
        return self.max_num_seqs if self.speculative_tree_nodes else self.max_logits_rows

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
