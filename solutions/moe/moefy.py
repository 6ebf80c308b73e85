"""MoE-fy the bundled SmolLM2 and measure what top-k costs
(``python -m solutions moefy --experts 8`` runs it).

MoEfication (Zhang et al., 2022) without retraining the model:

1. run the dense model on calibration text (``data/text/kjv_genesis_1-15.txt``) and keep each layer's
   FFN input ``x`` and activations ``a = silu(W_gate x) * W_up x``;
2. per layer, split the ``I`` neurons into ``E`` equal experts by balanced k-means on co-activation
   (``--split random`` for the baseline a clustering must beat);
3. per layer, train a linear router on the model's own activations to predict each expert's
   contribution (``moe.split.train_router``);
4. score perplexity on held-out text (``data/text/kjv_luke_1-12.txt``) for each ``k``, beside the
   FFN FLOPs per token; ``k = E`` must reproduce the dense model (checked and printed);
5. write the converted model as a Hugging Face style folder (``config.json`` with ``model_type``
   ``moefied_llama``, Mixtral tensor names, ``tokenizer.json``) that ``LLM(model=folder)`` loads.

Steps 1-3 are cached in ``data/moe/`` (the neuron split and router weights, under 1 MB); ``--recompute``
redoes them. The folder (about 540 MB of float32) goes under ``$FASTMODE_CACHE`` unless ``--out`` says
otherwise, and is not part of the repository.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..kernels.attention import gqa_attention
from ..model.config import ModelConfig
from ..model.llama import LlamaModel
from ..model.loader import bundled_model_path
from ..model.tokenizer import TextTokenizer
from ..paths import DATA_DIR
from .split import balanced_kmeans, expert_importance, neurons_by_expert, top_k_recall, train_router

CALIBRATION_TEXT = DATA_DIR / "text" / "kjv_genesis_1-15.txt"
EVALUATION_TEXT = DATA_DIR / "text" / "kjv_luke_1-12.txt"
WINDOW = 512


def artefact_path(num_experts: int, split: str = "coactivation") -> Path:
    suffix = "" if split == "coactivation" else f".{split}"
    return DATA_DIR / "moe" / f"{bundled_model_path().stem}.moe{num_experts}{suffix}.safetensors"


@torch.inference_mode()
def collect_ffn_inputs(model: LlamaModel, token_ids: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's FFN input (the post-attention RMSNorm's output) ``[T, H]`` over
    ``token_ids``, window by window."""
    inputs: list[list[torch.Tensor]] = [[] for _ in model.layers]
    hooks = [
        layer.post_attention_layernorm.register_forward_hook(
            lambda m, args, out, i=i: inputs[i].append(out[0])
        )
        for i, layer in enumerate(model.layers)
    ]

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads_first = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        return gqa_attention(*heads_first, causal=True)[0].transpose(0, 1)

    try:
        for start in range(0, len(token_ids), WINDOW):
            window = token_ids[start : start + WINDOW]
            model(window, torch.arange(len(window)), attend)  # hidden states only: the LM head is not needed
    finally:
        for hook in hooks:
            hook.remove()
    return [torch.cat(chunks) for chunks in inputs]


def split_model(
    model: LlamaModel, token_ids: torch.Tensor, num_experts: int, split: str = "coactivation", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Neurons ``[L, E, I/E]``, routers ``[L, E, H]``, and each router's top-(E/4)
    recall on the last 10% of tokens."""
    all_neurons, routers, recalls = [], [], []
    for layer, x in zip(model.layers, collect_ffn_inputs(model, token_ids)):
        gate, up = (x @ layer.mlp.gate_up_proj.weight.t()).chunk(2, dim=-1)
        activations = F.silu(gate) * up
        width = activations.shape[1]
        if split == "coactivation":
            labels = balanced_kmeans(activations.abs().t(), num_experts, seed=seed)
        elif split == "random":
            labels = torch.randperm(width, generator=torch.Generator().manual_seed(seed)) % num_experts
        else:
            raise ValueError(f"split must be 'coactivation' or 'random', got {split!r}")
        neurons = neurons_by_expert(labels, num_experts)
        importance = expert_importance(activations, layer.mlp.down_proj.weight, neurons)
        train = int(0.9 * len(x))
        router = train_router(x[:train], importance[:train], seed=seed)
        recalls.append(top_k_recall(x[train:] @ router.t(), importance[train:], max(1, num_experts // 4)))
        all_neurons.append(neurons)
        routers.append(router)
    return torch.stack(all_neurons), torch.stack(routers), recalls


def moefied_config(config: ModelConfig, num_experts: int, top_k: int) -> ModelConfig:
    """The dense config with its FFN cut into ``num_experts`` experts of ``I / E``
    neurons, unit-weight routing."""
    return replace(
        config,
        intermediate_size=config.intermediate_size // num_experts,
        num_local_experts=num_experts,
        num_experts_per_tok=top_k,
        moe_router="unit",
    )


def moefied_state_dict(
    state_dict: dict[str, torch.Tensor], neurons: torch.Tensor, routers: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Dense Hugging Face Llama tensors -> Mixtral-named experts
    (``w1`` gate, ``w3`` up, ``w2`` down) and routers."""
    moe = {}
    for name, tensor in state_dict.items():
        if ".mlp." not in name:
            moe[name] = tensor
    for layer, (layer_neurons, router) in enumerate(zip(neurons, routers)):
        dense, out = f"model.layers.{layer}.mlp.", f"model.layers.{layer}.block_sparse_moe."
        moe[out + "gate.weight"] = router.contiguous()
        for expert, idx in enumerate(layer_neurons):
            moe[f"{out}experts.{expert}.w1.weight"] = state_dict[dense + "gate_proj.weight"][idx].contiguous()
            moe[f"{out}experts.{expert}.w3.weight"] = state_dict[dense + "up_proj.weight"][idx].contiguous()
            moe[f"{out}experts.{expert}.w2.weight"] = state_dict[dense + "down_proj.weight"][
                :, idx
            ].contiguous()
    return moe


def hf_config_json(config: ModelConfig) -> dict:
    """``config.json`` for a MoE-fied model, in Hugging Face's field names
    (read back by ``ModelConfig.from_hf_config``)."""
    return {
        "model_type": "moefied_llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) or None,
        "num_local_experts": config.num_local_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "moe_router": config.moe_router,
        "sliding_window": None,
    }


def write_folder(
    folder: Path,
    config: ModelConfig,
    state_dict: dict[str, torch.Tensor],
    tokenizer: TextTokenizer | None = None,
) -> None:
    """Write ``config.json``, ``model.safetensors`` and (if given)
    ``tokenizer.json`` + ``tokenizer_config.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf_config_json(config), indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(folder / "model.safetensors"))
    if tokenizer is not None:
        tokenizer.backend.save(str(folder / "tokenizer.json"))
        (folder / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": tokenizer.chat_template}) + "\n"
        )


def ffn_flops_per_token(config: ModelConfig, num_experts: int, top_k: int | None) -> float:
    """Multiply-adds x 2 of every layer's FFN for one token; ``top_k=None`` is the dense FFN (no router)."""
    dense = 2 * 3 * config.hidden_size * config.intermediate_size
    per_layer = dense if top_k is None else 2 * config.hidden_size * num_experts + dense * top_k / num_experts
    return config.num_layers * per_layer


def load_or_compute_split(
    model: LlamaModel,
    tokenizer: TextTokenizer,
    num_experts: int,
    split: str,
    calib_tokens: int,
    recompute: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The split and routers from ``data/moe/`` if cached
    (and not ``recompute``), else computed and cached."""
    path = artefact_path(num_experts, split)
    if path.exists() and not recompute:
        cached = load_file(str(path))
        return cached["neurons"].long(), cached["routers"]
    ids = torch.tensor(tokenizer.encode(CALIBRATION_TEXT.read_text())[:calib_tokens])
    start = time.perf_counter()
    neurons, routers, recalls = split_model(model, ids, num_experts, split)
    print(f"split ({split}) and routers trained on {len(ids)} tokens of {CALIBRATION_TEXT.name} "
          f"in {time.perf_counter() - start:.0f} s; held-out top-{max(1, num_experts // 4)} router recall: "
          f"mean {sum(recalls) / len(recalls):.2f}, min {min(recalls):.2f}", flush=True)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {
        "command": f"python -m solutions moefy --experts {num_experts} --split {split} --recompute",
        "calibration": f"first {len(ids)} tokens of data/text/{CALIBRATION_TEXT.name}",
        "router_recall": json.dumps([round(r, 4) for r in recalls]),
    }
    save_file(
        {"neurons": neurons.to(torch.int16), "routers": routers.contiguous()}, str(path), metadata=metadata
    )
    return neurons, routers
