"""The tokenizer: byte-level BPE rebuilt from a GGUF vocabulary, and the chat template.

A GGUF file carries no ``tokenizer.json``, only the vocabulary, the merges, each token's type and
the chat template as metadata. We rebuild the same byte-level BPE with the ``tokenizers`` library
(no hub): tokens of type CONTROL (3) become special tokens so ``<|im_start|>`` stays one id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

_CONTROL = 3
_USER_DEFINED = 4


def tokenizer_from_gguf_metadata(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE tokenizer from ``tokenizer.ggml.*`` fields (llama.cpp's 'gpt2' model)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, this file has {kind!r}")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    return tokenizer


class TextTokenizer:
    """Encode, decode and apply the chat template, with the ids the model was trained on."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, eos_token_id: int | None):
        self.backend = tokenizer
        self.chat_template = chat_template
        self.eos_token_id = eos_token_id

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> TextTokenizer:
        return cls(
            tokenizer_from_gguf_metadata(meta),
            meta.get("tokenizer.chat_template"),
            meta.get("tokenizer.ggml.eos_token_id"),
        )

    @classmethod
    def from_hf_folder(cls, folder: Path, eos_token_id: int | None) -> TextTokenizer:
        if not (folder / "tokenizer.json").exists():
            raise FileNotFoundError(f"{folder} has no tokenizer.json; the engine needs one to read text")
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), config.get("chat_template"), eos_token_id)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render a conversation with the model's own Jinja template, as transformers does."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass plain prompts to generate() instead")
        if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt
        )
