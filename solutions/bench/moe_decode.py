"""Batch-1 decode of a whole MoE model against dense models, for notebook 05: does a MoE token cost what its
active parameters cost?

Three random checkpoints of one Mixtral-like shape, written as Hugging Face folders the engine loads like any
other (``config.json`` + ``model.safetensors``, no tokenizer: prompts are token ids):

- ``moe``: every FFN is ``E`` SwiGLU experts of width ``I``, ``k`` of them per token (Mixtral's router);
- ``dense, same total``: one FFN of width ``E * I`` (the MoE's parameters, all read per token);
- ``dense, same active``: one FFN of width ``k * I`` (the parameters a MoE token reads).

Attention, embeddings and LM head are the same shape in all three. Weights are ``N(0, 1 / fan_in)``, seeded,
so routing spreads tokens over the experts as a trained router roughly does; the outputs mean nothing, only
the cost of producing them is measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..llm import LLM
from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class MoeShape:
    """A Mixtral-like decoder, scaled: ``experts`` FFNs of width ``width`` per layer, ``top_k`` per token."""

    hidden: int = 1024
    width: int = 3584  # Mixtral's I / H = 14336 / 4096 = 3.5
    layers: int = 2
    heads: int = 16
    kv_heads: int = 4
    vocab: int = 8192
    experts: int = 8
    top_k: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k must be in [1, experts={self.experts}], got {self.top_k}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"hidden ({self.hidden}) must split into heads ({self.heads}), "
                f"a multiple of kv_heads ({self.kv_heads})"
            )

    def parameters(self, ffn_width: int) -> int:
        """Parameters of a dense model with FFN width ``ffn_width`` (the MoE's total: ``experts * width``; its
        active: ``top_k * width``, the router's ``experts * hidden`` per layer aside)."""
        head_dim = self.hidden // self.heads
        attention = self.hidden * head_dim * (2 * self.heads + 2 * self.kv_heads)
        norms = (2 * self.layers + 1) * self.hidden
        return self.layers * (attention + 3 * self.hidden * ffn_width) + 2 * self.vocab * self.hidden + norms

    def hf_configs(self) -> dict[str, dict]:
        """The three models' ``config.json`` contents, by name."""
        common = {
            "vocab_size": self.vocab, "hidden_size": self.hidden, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "rms_norm_eps": 1e-5,
            "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": False,
        }  # fmt: skip
        moe = {"model_type": "mixtral", "intermediate_size": self.width, "num_local_experts": self.experts,
               "num_experts_per_tok": self.top_k}  # fmt: skip
        dense = common | {"model_type": "llama"}
        return {
            "moe": common | moe,
            "dense, same total": dense | {"intermediate_size": self.experts * self.width},
            "dense, same active": dense | {"intermediate_size": self.top_k * self.width},
        }


def random_state_dict(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Float32 tensors under Hugging Face's names for ``config`` (Llama, or Mixtral with stacked experts)."""
    g = torch.Generator().manual_seed(seed)
    hidden, width, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    head_dim = hidden // config["num_attention_heads"]
    q_rows, kv_rows = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * shape[-1] ** -0.5

    state = {"model.embed_tokens.weight": rand(vocab, hidden), "lm_head.weight": rand(vocab, hidden)}
    state["model.norm.weight"] = torch.ones(hidden)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows)):
            state[p + f"self_attn.{name}_proj.weight"] = rand(rows, hidden)
        state[p + "self_attn.o_proj.weight"] = rand(hidden, q_rows)
        state[p + "input_layernorm.weight"] = torch.ones(hidden)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        experts = config.get("num_local_experts", 0)
        if experts:
            state[p + "mlp.gate.weight"] = rand(experts, hidden)
            state[p + "mlp.experts.gate_up_proj"] = rand(experts, 2 * width, hidden)
            state[p + "mlp.experts.down_proj"] = rand(experts, hidden, width)
        else:
            state[p + "mlp.gate_proj.weight"] = rand(width, hidden)
            state[p + "mlp.up_proj.weight"] = rand(width, hidden)
            state[p + "mlp.down_proj.weight"] = rand(hidden, width)
    return state


def write_random_checkpoint(folder: Path, config: dict, seed: int = 0) -> Path:
    """``folder`` with ``config.json`` and a random ``model.safetensors``: a checkpoint ``LLM(model=folder,
    skip_tokenizer_init=True)`` loads."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file(random_state_dict(config, seed), str(folder / "model.safetensors"))
    return folder


def load_engines(shape: MoeShape, root: Path, kv_cache_memory: int = 64 << 20) -> dict[str, LLM]:
    """The three models of ``shape`` written under ``root`` and loaded as float32 CPU engines for batch-1
    decode (one sequence, a small KV cache each)."""
    return {
        name: LLM(
            str(write_random_checkpoint(root / f"model{i}", config)), skip_tokenizer_init=True, device="cpu",
            dtype="float32", max_num_seqs=1, kv_cache_memory=kv_cache_memory,
        )  # fmt: skip
        for i, (name, config) in enumerate(shape.hf_configs().items())
    }


def decode_call(llm: LLM, new_tokens: int, prompt: list[int] | None = None):
    """A call that decodes ``new_tokens`` greedy tokens after a short token-id prompt, at batch 1."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    ids = prompt or [1, 2, 3, 4]
    return lambda: llm.generate([ids], params, use_tqdm=False)
