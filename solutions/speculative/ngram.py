"""Prompt-lookup decoding (Saxena, 2023): draft by copying what followed the last n-gram earlier in the text.

Answers quote their context: code repeats identifiers, summaries repeat names, edits repeat whole
lines. When the last ``n`` tokens already occurred earlier in the sequence, the tokens that followed
them there are a free guess for what comes next. No model, no training; it fails quietly (no match: no
draft) and the target's verification keeps the output exact either way.
"""

from __future__ import annotations


def propose_ngram(token_ids: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``num_tokens`` drafts: what followed the most recent earlier match of the longest suffix
    n-gram (``max_ngram`` down to ``min_ngram`` tokens). Empty when nothing matches."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    length = len(token_ids)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = token_ids[length - n :]
        # Scan right to left for the most recent earlier occurrence (it may overlap the suffix itself).
        for start in range(length - n - 1, -1, -1):
            if token_ids[start : start + n] == suffix:
                follow = token_ids[start + n : start + n + num_tokens]
                if follow:
                    return follow
    return []
