"""The shape of a Llama-architecture model, read from a GGUF file's metadata or a HF config.json.

The checkpoint's metadata is the single source of truth: whether the LM head is tied, which token ids
end a turn, and how RoPE is scaled all come from it. Anything we cannot honour raises, naming it and
what is supported, rather than loading a model that would compute something else.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from typing import Any

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)
MOE_MODEL_TYPES = ("mixtral", "moefied_llama")
SUPPORTED_HF_MODEL_TYPES = ("llama", "mistral", *MOE_MODEL_TYPES)
MOE_ROUTERS = (
    "softmax",
    "unit",
)  # Mixtral's renormalised softmax weights; MoEfication's weight 1 per chosen expert
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    """How RoPE's inverse frequencies are rescaled for a longer context (Hugging Face's ``rope_type``).

    ``linear`` divides every frequency by ``factor``; ``llama3`` (Llama-3.1/3.2) divides the low
    frequencies by ``factor``, keeps the high ones, and blends in between; ``dynamic`` (NTK) equals the
    default RoPE up to ``max_position_embeddings``, which is the engine's context limit. A GGUF file
    carries Llama-3's result instead, as per-frequency divisors (``freq_factors``, its ``rope_freqs``).
    """

    rope_type: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in SUPPORTED_ROPE_TYPES[1:]:
            raise ValueError(
                f"RoPE type {self.rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Everything the model code needs to build a Llama-family decoder.

    Invariants: ``num_heads % num_kv_heads == 0`` (grouped-query attention), ``head_dim * num_heads``
    is the width of the query projection, and ``eos_token_id`` (the primary end-of-sequence id) is
    the first of ``eos_token_ids`` (every id that ends generation) when there is one.
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
    eos_token_ids: tuple[int, ...] = field(default=())
    rope_scaling: RopeScaling | None = None
    # Mixture of experts (Lesson 5): 0 experts means a dense MLP;
    # intermediate_size is then each expert's width.
    num_local_experts: int = 0
    num_experts_per_tok: int = 0
    moe_router: str = "softmax"

    def __post_init__(self) -> None:
        if self.num_local_experts and not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(
                f"num_experts_per_tok must be in [1, {self.num_local_experts}] (num_local_experts), "
                f"got {self.num_experts_per_tok}"
            )
        if self.moe_router not in MOE_ROUTERS:
            raise ValueError(f"moe_router must be one of {MOE_ROUTERS}, got {self.moe_router!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.eos_token_id is not None and not self.eos_token_ids:
            object.__setattr__(self, "eos_token_ids", (self.eos_token_id,))
        if self.eos_token_ids and self.eos_token_id != self.eos_token_ids[0]:
            raise ValueError(
                f"eos_token_id {self.eos_token_id} must be the first of eos_token_ids {self.eos_token_ids}"
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values; ``from_dict`` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        values = dict(values)
        scaling = values.get("rope_scaling")
        if isinstance(scaling, dict):
            factors = scaling.get("freq_factors")
            values["rope_scaling"] = RopeScaling(**{**scaling, "freq_factors": factors and tuple(factors)})
        values["eos_token_ids"] = tuple(values.get("eos_token_ids") or ())
        return cls(**values)

    @classmethod
    def from_gguf_metadata(
        cls,
        meta: dict[str, Any],
        tensor_names: Collection[str] = (),
        rope_freq_factors: tuple[float, ...] | None = None,
    ) -> ModelConfig:
        """From GGUF metadata plus what only the tensors tell: whether ``output.weight`` (an untied LM
        head) is present, and Llama-3's RoPE frequency divisors (the ``rope_freqs.weight`` tensor)."""
        arch = meta["general.architecture"]
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {arch!r} is not supported; supported: "
                f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
            )

        def key(name: str) -> Any:
            return meta[f"{arch}.{name}"]

        hidden, heads = int(key("embedding_length")), int(key("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
        eos_ids = gguf_eos_token_ids(meta)
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
            # llama.cpp's converter leaves output.weight out exactly when the LM head is the embedding matrix.
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
            eos_token_ids=eos_ids,
            rope_scaling=_gguf_rope_scaling(meta, arch, rope_freq_factors),
        )

    @classmethod
    def from_hf_config(
        cls, cfg: dict[str, Any], generation_config: dict[str, Any] | None = None
    ) -> ModelConfig:
        """From a checkpoint folder's ``config.json`` (and ``generation_config.json``, for its EOS ids)."""
        model_type = cfg.get("model_type", "llama")
        if model_type not in SUPPORTED_HF_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; supported: "
                f"{', '.join(SUPPORTED_HF_MODEL_TYPES)}"
            )
        window, max_positions = cfg.get("sliding_window"), int(cfg.get("max_position_embeddings", 2048))
        if window is not None and int(window) < max_positions:
            raise ValueError(
                f"sliding-window attention (sliding_window={window}) is not supported; "
                "only full causal attention"
            )
        heads = int(cfg["num_attention_heads"])
        theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        eos_ids = _hf_eos_token_ids(cfg, generation_config or {})
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
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_ids[0] if eos_ids else None,
            eos_token_ids=eos_ids,
            rope_scaling=_hf_rope_scaling(cfg),
            **moe_fields(cfg),
        )


def _ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _unique(ids: list[int]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(ids))


def gguf_eos_token_ids(meta: dict[str, Any]) -> tuple[int, ...]:
    """EOS first, then end-of-turn and end-of-message (Llama-3's ``<|eot_id|>``, ``<|eom_id|>``)."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    return _unique([int(meta[k]) for k in keys if meta.get(k) is not None])


def _hf_eos_token_ids(cfg: dict[str, Any], generation_config: dict[str, Any]) -> tuple[int, ...]:
    """config.json's EOS id(s) first, then generation_config.json's list
    (where Llama-3 keeps ``<|eot_id|>``)."""
    return _unique(_ids(cfg.get("eos_token_id")) + _ids(generation_config.get("eos_token_id")))


def _hf_rope_scaling(cfg: dict[str, Any]) -> RopeScaling | None:
    """``rope_scaling`` (transformers 4.x, Llama-3's own config.json) or ``rope_parameters`` (5.x)."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"RoPE type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if "factor" not in params:
        raise ValueError(f"RoPE scaling {params!r} has no 'factor'")
    original = params.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 8192))
    return RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(original),
    )


def _gguf_rope_scaling(
    meta: dict[str, Any], arch: str, freq_factors: tuple[float, ...] | None
) -> RopeScaling | None:
    """``{arch}.rope.scaling.type`` (none / linear) and the ``rope_freqs`` divisors
    llama.cpp writes for Llama-3."""
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type not in ("none", "linear"):
        raise ValueError(
            f"GGUF RoPE scaling {scaling_type!r} is not supported; supported: none, linear, rope_freqs"
        )
    if scaling_type == "linear" and freq_factors is not None:
        raise ValueError(
            "this GGUF has both linear RoPE scaling and rope_freqs; only one of them is supported"
        )
    if freq_factors is not None:
        return RopeScaling(rope_type="llama3", freq_factors=tuple(float(f) for f in freq_factors))
    if scaling_type == "linear":
        return RopeScaling(rope_type="linear", factor=float(meta[f"{arch}.rope.scaling.factor"]))
    return None


def moe_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    """The MoE fields of a HF config.json: none for a dense model;
    Mixtral's and the MoE-fied SmolLM2's otherwise."""
    if cfg.get("model_type") not in MOE_MODEL_TYPES:
        return {}
    return dict(
        num_local_experts=int(cfg["num_local_experts"]),
        num_experts_per_tok=int(cfg["num_experts_per_tok"]),
        moe_router=cfg.get("moe_router", "softmax"),
    )
