"""Which tensor splits how: the Megatron-LM layout of a Llama over ``N`` ranks, each holding a piece of each.

    q_proj, k_proj, v_proj  rows (output features): rank r owns whole heads, Hq / N query and Hkv / N KV heads
    gate_proj, up_proj      rows: rank r owns the intermediate channels [r I/N, (r+1) I/N)
    o_proj, down_proj       columns (input features): those that the rank's heads / channels produce
    embed_tokens, lm_head   rows: a contiguous range of the vocabulary, padded with zero rows to ceil(V / N)
    the norms               whole, on every rank

So a decoder layer needs one all-reduce after attention and one after the MLP: a column-parallel projection
leaves each rank with its own heads or channels, everything between (RoPE, attention over the rank's KV heads,
SiLU-mul) is local to them, and the row-parallel projection that follows turns them into a partial sum of the
full output. Each rank's KV cache holds its KV heads only, under the same block table as every other rank's.

``ShardedStateDict`` cuts a lazy state dict (Hugging Face names) this way one tensor at a time, so a rank
never holds more of the model than its shard plus one source tensor; ``shard_config`` gives the shapes its
modules have.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping

import torch

from ..kernels.blocks import cdiv
from ..model.config import ModelConfig


def supported_sizes(config: ModelConfig) -> list[int]:
    """Tensor-parallel sizes this model splits into whole heads and equal MLP shards."""
    common = math.gcd(config.num_heads, config.num_kv_heads, config.intermediate_size)
    return [n for n in range(1, common + 1) if common % n == 0]


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """Raise a ValueError naming the counts if ``world_size`` ranks cannot split this model (before any
    process starts): each rank owns whole query and KV heads and an equal share of the MLP channels."""
    if config.num_local_experts:
        raise ValueError(
            "tensor parallelism does not shard Mixture-of-Experts models in this version "
            f"({config.num_local_experts} experts per layer): use tensor_parallel_size=1"
        )
    counts = {
        "query heads": config.num_heads,
        "KV heads": config.num_kv_heads,
        "MLP channels": config.intermediate_size,
    }
    undivided = [f"{count} {what}" for what, count in counts.items() if count % world_size]
    if undivided:
        whole = ", ".join(f"{count} {what}" for what, count in counts.items())
        raise ValueError(
            f"tensor_parallel_size={world_size} does not divide the model's {' and '.join(undivided)}: each "
            f"rank owns whole heads and an equal share of the MLP channels (the model has {whole}); sizes "
            f"that fit: {', '.join(map(str, supported_sizes(config)))}"
        )


def vocab_rows(vocab_size: int, world_size: int) -> int:
    """Rows of each rank's embedding / LM head shard: ``ceil(V / N)`` (the last shard is padded with zero
    rows)."""
    return cdiv(vocab_size, world_size)


def vocab_range(vocab_size: int, rank: int, world_size: int) -> tuple[int, int]:
    """The token ids ``[start, end)`` rank owns (``end - start`` may be short of ``vocab_rows`` on the last
    rank)."""
    rows = vocab_rows(vocab_size, world_size)
    return min(rank * rows, vocab_size), min((rank + 1) * rows, vocab_size)


def even_part(size: int, rank: int, world_size: int) -> slice:
    """Rank's share of ``size`` channels (``size`` divisible by ``world_size``)."""
    part = size // world_size
    return slice(rank * part, (rank + 1) * part)


def head_part(num_heads: int, head_dim: int, rank: int, world_size: int) -> slice:
    """The rows (or columns) of rank's whole heads in a ``[num_heads * head_dim, ...]`` projection."""
    heads = even_part(num_heads, rank, world_size)
    return slice(heads.start * head_dim, heads.stop * head_dim)


def shard_config(config: ModelConfig, world_size: int) -> ModelConfig:
    """The shapes one rank's modules have: ``Hq / N`` and ``Hkv / N`` heads, ``I / N`` MLP channels and
    ``ceil(V / N)`` vocabulary rows; everything else as in ``config``."""
    check_shardable(config, world_size)
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // world_size,
        num_kv_heads=config.num_kv_heads // world_size,
        intermediate_size=config.intermediate_size // world_size,
        vocab_size=vocab_rows(config.vocab_size, world_size),
    )


LAYER_TENSOR = re.compile(r"model\.layers\.\d+\.(?P<module>self_attn|mlp)\.(?P<proj>\w+)\.weight")


def split_of(name: str, config: ModelConfig, rank: int, world_size: int) -> tuple[int, slice] | None:
    """How rank cuts the Hugging Face tensor ``name``: ``(dim, part)`` (0: rows, 1: columns), or None
    (whole)."""
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        return 0, slice(*vocab_range(config.vocab_size, rank, world_size))
    match = LAYER_TENSOR.fullmatch(name)
    if match is None:
        return None  # norms: every rank holds them whole
    proj, d = match["proj"], config.head_dim
    if proj == "q_proj":
        return 0, head_part(config.num_heads, d, rank, world_size)
    if proj in ("k_proj", "v_proj"):
        return 0, head_part(config.num_kv_heads, d, rank, world_size)
    if proj == "o_proj":
        return 1, head_part(config.num_heads, d, rank, world_size)
    if proj in ("gate_proj", "up_proj"):
        return 0, even_part(config.intermediate_size, rank, world_size)
    if proj == "down_proj":
        return 1, even_part(config.intermediate_size, rank, world_size)
    raise ValueError(f"{name}: no tensor-parallel split is defined for {proj}")


def shard_tensor(
    name: str, tensor: torch.Tensor, config: ModelConfig, rank: int, world_size: int
) -> torch.Tensor:
    """Rank's piece of ``tensor`` (a copy: the source can be freed), the vocabulary shards padded to full
    rows."""
    split = split_of(name, config, rank, world_size)
    if split is None:
        return tensor
    dim, part = split
    piece = tensor.narrow(dim, part.start, part.stop - part.start).clone()
    if dim == 0 and name in ("model.embed_tokens.weight", "lm_head.weight"):
        missing = vocab_rows(config.vocab_size, world_size) - piece.shape[0]
        if missing:
            piece = torch.cat([piece, piece.new_zeros(missing, *piece.shape[1:])])
    return piece


class ShardedStateDict(Mapping[str, torch.Tensor]):
    """Rank's shard of each tensor of a (lazy) Hugging Face state dict, cut when it is looked up and never
    kept.

    Same names as ``source``; ``LlamaModel.from_state_dict(shard_config(config, N), ShardedStateDict(...))``
    builds this rank's model, fusing Q/K/V and gate/up over its own heads and channels as it does for the
    whole model.
    """

    def __init__(self, source: Mapping[str, torch.Tensor], config: ModelConfig, rank: int, world_size: int):
        check_shardable(config, world_size)
        self.source, self.config, self.rank, self.world_size = source, config, rank, world_size

    def __getitem__(self, name: str) -> torch.Tensor:
        return shard_tensor(name, self.source[name], self.config, self.rank, self.world_size)

    def __iter__(self) -> Iterator[str]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)


def shard_awq_params(
    params: Mapping[str, torch.Tensor], config: ModelConfig, rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """AWQ's calibrated ``{linear}.scales`` (one per input channel) and ``{linear}.clip`` (one per output
    row), cut like the weights they belong to, so a rank's packed weights are exactly the pieces of the whole
    model's.

    A column-parallel linear keeps every input scale and the clip indices of its own rows; a row-parallel one
    keeps the scales of its own input columns and every row's clip index. Groups of input channels stay whole
    as long as ``group_size`` divides each rank's columns (``quantize_model`` checks it)."""
    d, interm = config.head_dim, config.intermediate_size
    q_size, kv_size = config.num_heads * d, config.num_kv_heads * d
    q, kv = (
        head_part(config.num_heads, d, rank, world_size),
        head_part(config.num_kv_heads, d, rank, world_size),
    )
    mlp = even_part(interm, rank, world_size)
    fused_rows: dict[str, list[slice]] = {
        "qkv_proj": [q, _shifted(kv, q_size), _shifted(kv, q_size + kv_size)],
        "gate_up_proj": [mlp, _shifted(mlp, interm)],
    }
    columns = {"o_proj": q, "down_proj": mlp}
    rules: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    for proj, rows in fused_rows.items():
        rules[f"{proj}.clip"] = lambda t, rows=rows: torch.cat([t[r] for r in rows])
    for proj, cols in columns.items():
        rules[f"{proj}.scales"] = lambda t, cols=cols: t[cols].clone()
    rules["lm_head.clip"] = lambda t: shard_tensor("lm_head.weight", t, config, rank, world_size)
    sharded = {}
    for name, tensor in params.items():
        key = name.removeprefix("layers.").partition(".")[2] if name.startswith("layers.") else name
        sharded[name] = rules[key](tensor) if key in rules else tensor
    return sharded


def _shifted(part: slice, offset: int) -> slice:
    return slice(part.start + offset, part.stop + offset)
