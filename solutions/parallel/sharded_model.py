"""One rank's model: its shard of each weight, loaded a tensor at a time, with the communicating layers in.

    LlamaModel.from_state_dict(shard_config, ShardedStateDict)   the plain model over this rank's heads
    quantize_model(..., AWQ parameters cut the same way)         (if quantized: this rank's packed pieces)
    parallelize                                                  o_proj, down_proj -> RowParallelLinear;
                                                                 embed_tokens, lm_head -> vocab-parallel

The plain model code runs unchanged on a shard: its attention sees ``Hq / N`` query and ``Hkv / N`` KV heads,
its MLP ``I / N`` channels. Only the four swapped modules communicate.
"""

from __future__ import annotations

from ..config import EngineConfig
from ..model.llama import LlamaModel
from ..model.loader import LoadedWeights
from ..quant.awq import load_awq_params
from ..quant.model import quantize_model
from .group import TensorParallelGroup
from .layers import ParallelLMHead, RowParallelLinear, VocabParallelEmbedding
from .shard import ShardedStateDict, shard_awq_params, shard_config, vocab_range


def build_shard(config: EngineConfig, weights: LoadedWeights, group: TensorParallelGroup) -> LlamaModel:
    """This rank's model of ``weights`` (quantized as ``config`` says), its collectives over ``group``."""
    rank, world = group.rank, group.world_size
    state = ShardedStateDict(weights.state_dict, weights.config, rank, world)
    model = LlamaModel.from_state_dict(
        shard_config(weights.config, world), state, group.device, config.torch_dtype
    )
    if config.quantization:
        params = None
        if config.quantization == "awq":
            whole = load_awq_params(weights.source.stem, config.w_bit, config.group_size)
            params = shard_awq_params(whole, weights.config, rank, world)
        quantize_model(model, config.quantization, config.w_bit, config.group_size, params)
    parallelize(model, weights.config.vocab_size, group)
    return model


def parallelize(model: LlamaModel, vocab_size: int, group: TensorParallelGroup) -> None:
    """Wrap a shard model's row-parallel projections and vocabulary layers (in place) so they communicate."""
    for layer in model.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, group)
        layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj, group)
    start, end = vocab_range(vocab_size, group.rank, group.world_size)
    model.embed_tokens = VocabParallelEmbedding(model.embed_tokens, start, end, group)
    model.lm_head = ParallelLMHead(model.lm_head, vocab_size, group)
