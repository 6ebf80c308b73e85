"""The tokenizer: byte-level BPE rebuilt from a GGUF vocabulary, and the chat template.

A GGUF file carries no ``tokenizer.json``, only the vocabulary, the merges, each token's type, the
name of its pre-tokenizer (``tokenizer.ggml.pre``), whether to prepend BOS, and the chat template as
metadata. We rebuild the same tokenizer with the ``tokenizers`` library (no hub): the pre-tokenizer
the model family was trained with, tokens of type CONTROL (3) as special tokens so ``<|im_start|>``
stays one id, and BOS prepended by a post-processor when the file says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from .config import gguf_eos_token_ids

_CONTROL = 3
_USER_DEFINED = 4

# Llama-3's split (tiktoken's cl100k pattern): letters with one leading non-letter, numbers in runs of
# at most three digits, punctuation runs that swallow trailing newlines, then whitespace.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    # SmolLM's tokenizer isolates every digit, then splits as GPT-2 does.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_pre_tokenizer()])


def _llama3_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


# llama.cpp's ``tokenizer.ggml.pre`` name -> (pre-tokenizer, whether a word already in the vocabulary
# skips the merges, as Llama-3's tokenizer does with ``ignore_merges``).
PRE_TOKENIZERS = {
    "gpt-2": (_gpt2_pre_tokenizer, False),
    "smollm": (_smollm_pre_tokenizer, False),
    "llama-bpe": (_llama3_pre_tokenizer, True),
    "llama3": (_llama3_pre_tokenizer, True),
    "llama-v3": (_llama3_pre_tokenizer, True),
}


def tokenizer_from_gguf_metadata(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE tokenizer from ``tokenizer.ggml.*`` fields (llama.cpp's 'gpt2' model)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"only byte-level BPE ('gpt2') GGUF tokenizers are supported, this file has {kind!r}"
        )
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF pre-tokenizer (tokenizer.ggml.pre) {pre!r} is not supported; supported: "
            f"{', '.join(PRE_TOKENIZERS)}"
        )
    make_pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = make_pre_tokenizer()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == _CONTROL]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == _USER_DEFINED]
    )
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        bos_token = tokens[bos]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A {bos_token} $B", special_tokens=[(bos_token, bos)]
        )
    return tokenizer


class TextTokenizer:
    """Encode, decode and apply the chat template, with the ids the model was trained on.

    ``eos_token_ids`` holds every id that ends generation (the first is ``eos_token_id``). ``encode``
    adds BOS when the model's tokenizer does (its post-processor), but never a second one in front
    of a text that already starts with it, such as a rendered chat template.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None = None,
    ):
        self.backend = tokenizer
        self.chat_template = chat_template
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> TextTokenizer:
        return cls(
            tokenizer_from_gguf_metadata(meta),
            meta.get("tokenizer.chat_template"),
            gguf_eos_token_ids(meta),
            meta.get("tokenizer.ggml.bos_token_id"),
        )

    @classmethod
    def from_hf_folder(
        cls, folder: Path, eos_token_ids: Sequence[int], bos_token_id: int | None
    ) -> TextTokenizer:
        if not (folder / "tokenizer.json").exists():
            raise FileNotFoundError(f"{folder} has no tokenizer.json; the engine needs one to read text")
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return cls(backend, config.get("chat_template"), eos_token_ids, bos_token_id)

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id (``eos_token_ids[0]``)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=True).ids
        bos = self.bos_token_id
        if bos is not None and ids[:2] == [bos, bos]:
            return ids[1:]
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def _token_text(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id) or ""

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render a conversation with the model's own Jinja template, as transformers does.

        The template sees ``bos_token`` and ``eos_token`` (Llama-3's template starts with ``bos_token``),
        and transformers' helpers ``raise_exception`` and ``strftime_now``.
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass plain prompts to generate() instead")
        if not messages or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages):
            raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(
            raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt)
        )
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._token_text(self.bos_token_id),
            eos_token=self._token_text(self.eos_token_id),
        )
