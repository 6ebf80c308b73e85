"""Prompt-lookup decoding (Saxena, 2023): draft by copying what followed the last n-gram earlier in the text.

Answers quote their context: code repeats identifiers, summaries repeat names, edits repeat whole
lines. When the last ``n`` tokens already occurred earlier in the sequence, the tokens that followed
them there are a free guess for what comes next. No model, no training; it fails quietly (no match: no
draft) and the target's verification keeps the output exact either way.
"""

from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], num_tokens: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Up to ``num_tokens`` drafts: what followed the most recent earlier match of the longest suffix
    n-gram (``max_ngram`` down to ``min_ngram`` tokens). Empty when nothing matches."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    length = len(token_ids)
    ids = np.asarray(token_ids)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        # Earlier starts 0 .. length - n - 1 (a token follows each; a match may overlap the suffix itself),
        # compared with the suffix one offset at a time over the whole sequence: numpy, not a Python scan.
        matches = ids[: length - n] == ids[length - n]
        for offset in range(1, n):
            matches &= ids[offset : length - n + offset] == ids[length - n + offset]
        found = np.flatnonzero(matches)
        if found.size:  # the most recent match wins
            start = int(found[-1])
            return list(token_ids[start + n : start + n + num_tokens])
    return []
