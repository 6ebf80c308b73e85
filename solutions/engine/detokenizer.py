"""Incremental detokenization with stop strings, as vLLM's output processor does it.

Each new token is decoded on its own by ``tokenizers``' ``DecodeStream`` (which buffers the bytes of a
character split across tokens), never by decoding the whole output again. Text that could still be the start
of a stop string is held back from the stream: with stop strings of at most ``S`` characters, the last
``S - 1`` characters are only emitted once the next token rules the stop string out, or the request ends.
"""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

PROMPT_CONTEXT = 4  # prompt tokens fed to the decoder first, so the first output token decodes in context


class IncrementalDetokenizer:
    """Invariant: ``text`` is the decoded output so far, cut before the first stop string found;
    ``text[:emitted]`` has been handed out as deltas, and ``emitted <= len(text)``."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], stop: list[str]):
        self.tokenizer = tokenizer
        self.stream = DecodeStream(ids=prompt_token_ids[-PROMPT_CONTEXT:], skip_special_tokens=True)
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""
        self.emitted = 0

    def add(self, token_id: int) -> str | None:
        """Decode one more token; returns the stop string it completed
        (the text is cut before it), else None."""
        chunk = self.stream.step(self.tokenizer, token_id)
        if not chunk:
            return None
        searched_from = max(0, len(self.text) - self.holdback)
        self.text += chunk
        for stop in self.stop:
            found = self.text.find(stop, searched_from)
            if found != -1:
                self.text = self.text[:found]
                return stop
        return None

    def delta(self, finished: bool) -> str:
        """The text not yet handed out, less what may still turn into a stop string (unless finished)."""
        end = len(self.text) if finished else len(self.text) - self.holdback
        if end <= self.emitted:
            return ""
        delta, self.emitted = self.text[self.emitted : end], end
        return delta


class NullDetokenizer:
    """For an engine without a tokenizer (``skip_tokenizer_init``): outputs carry token ids and no text."""

    text = ""

    def add(self, token_id: int) -> str | None:
        return None

    def delta(self, finished: bool) -> str:
        return ""
