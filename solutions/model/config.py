"""The shape of a Llama-architecture model, read from a GGUF file's metadata or a HF config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOE_MODEL_TYPES = ("mixtral", "moefied_llama")
MOE_ROUTERS = ("softmax", "unit")  # Mixtral's renormalised softmax weights; MoEfication's weight 1 per chosen expert


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs to build a Llama-family decoder.

    Invariants: ``num_heads % num_kv_heads == 0`` (grouped-query attention) and
    ``head_dim * num_heads`` is the width of the query projection.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    # Mixture of experts (Lesson 5): 0 experts means a dense MLP; intermediate_size is then each expert's width.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_router: str = "softmax"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok must be in [1, {self.num_local_experts}] (num_local_experts), "
                f"got {self.num_experts_per_tok}"
            )
        if self.moe_router not in MOE_ROUTERS:
            raise ValueError(f"moe_router must be one of {MOE_ROUTERS}, got {self.moe_router!r}")

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> ModelConfig:
        arch = meta["general.architecture"]
        if arch != "llama":
            raise ValueError(f"only the 'llama' GGUF architecture is supported, this file is {arch!r}")

        def key(name: str) -> Any:
            return meta[f"{arch}.{name}"]

        hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
        return cls(
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(key("feed_forward_length")),
            num_layers=int(key("block_count")),
            num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=int(meta.get(f"{arch}.rope.dimension_count", hidden // heads)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(key("context_length")),
            # GGUF files omit output.weight when the LM head is the embedding matrix.
            tie_word_embeddings=True,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        )

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelConfig:
        model_type = cfg.get("model_type", "llama")
        if model_type not in ("llama", "mistral", *MOE_MODEL_TYPES):
            raise ValueError(
                f"only Llama-architecture checkpoints (llama, mistral, mixtral) are supported, got model_type={model_type!r}"
            )
        scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {})
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise ValueError(f"RoPE scaling {scaling!r} is not supported by this engine")
        heads = int(cfg["num_attention_heads"])
        eos = cfg.get("eos_token_id")
        theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        return cls(
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            rope_theta=float(theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            **moe_fields(cfg),
        )


def moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The MoE fields of a HF config.json: none for a dense model; Mixtral's and the MoE-fied SmolLM2's otherwise."""
    if cfg.get("model_type") not in MOE_MODEL_TYPES:
        return {}
    if cfg.get("sliding_window") is not None:
        raise ValueError(f"sliding-window attention (sliding_window={cfg['sliding_window']}) is not supported")
    return dict(
        num_local_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_router=cfg.get("moe_router", "softmax"),
    )
