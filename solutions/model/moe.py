"""The Mixture-of-Experts MLP a decoder layer uses when its config has experts
(Mixtral, the MoE-fied SmolLM2).

    router_logits = gate(x)                                   [T, E]
    weights, experts = route(router_logits, k)                [T, k]
    y = sum_j weights[:, j] * expert_{experts[:, j]}(x)       each expert a SwiGLU FFN of width I

``router == "softmax"`` mixes the chosen experts with renormalised softmax weights (Mixtral);
``router == "unit"`` adds each chosen expert's output in full (MoEfication: the experts partition one
dense FFN's neurons, so choosing all ``E`` gives back the dense FFN exactly).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ..kernels.moe_gemm import fused_moe
from .config import ModelConfig
from .moe_router import route


class MoEMLP(nn.Module):
    """Experts stacked for a grouped GEMM:
    ``w13`` ``[E, 2I, H]`` (gate rows, then up), ``w2`` ``[E, H, I]``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        experts, hidden, width = config.num_local_experts, config.hidden_size, config.intermediate_size
        self.top_k = config.num_experts_per_tok
        self.unit_weights = config.moe_router == "unit"
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(experts, 2 * width, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, width))
        self.backend = "auto"  # "torch" | "triton" | "auto" (Triton on CUDA): see kernels.moe_gemm.fused_moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = route(self.gate(x), self.top_k)
        weights = torch.ones_like(routing.weights) if self.unit_weights else routing.weights
        return fused_moe(
            x, self.w13, self.w2, weights.to(x.dtype), routing.experts, self.backend, check_ids=False
        )


def moe_weight_sources(layer: int) -> dict[str, list[str]]:
    """One layer's MoE parameters -> their (stacked) Hugging Face Mixtral tensors: router, gate/up, down."""
    p, out = f"model.layers.{layer}.mlp.", f"layers.{layer}.mlp."
    return {
        out + "gate.weight": [p + "gate.weight"],
        out + "w13": [p + "experts.gate_up_proj"],
        out + "w2": [p + "experts.down_proj"],
    }


class _StackedExperts(Mapping):
    """``state_dict`` with each layer's per-expert Mixtral tensors seen as the stacked ones
    ``moe_weight_sources`` names; stacking happens when a stacked tensor is read, so a lazy ``state_dict``
    stays lazy."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor], num_layers: int, num_experts: int):
        self.base, self.num_experts, self.virtual = state_dict, num_experts, {}
        for layer in range(num_layers):
            old, new = f"model.layers.{layer}.block_sparse_moe.", f"model.layers.{layer}.mlp."
            if old + "gate.weight" in state_dict:
                self.virtual[new + "gate.weight"] = (old + "gate.weight", None)
                self.virtual[new + "experts.gate_up_proj"] = (old, ("w1", "w3"))
                self.virtual[new + "experts.down_proj"] = (old, ("w2",))
        hidden = {name for name in state_dict if ".block_sparse_moe." in name}
        self.names = [name for name in state_dict if name not in hidden] + list(self.virtual)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.virtual:
            return self.base[name]
        prefix, parts = self.virtual[name]
        if parts is None:
            return self.base[prefix]
        experts = range(self.num_experts)
        missing = [e for e in experts if f"{prefix}experts.{e}.{parts[0]}.weight" not in self.base]
        if missing:
            raise ValueError(f"{prefix}experts holds fewer experts than the config's {self.num_experts}")
        return torch.stack(
            [torch.cat([self.base[f"{prefix}experts.{e}.{part}.weight"] for part in parts]) for e in experts]
        )

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def stacked_experts(state_dict: Mapping[str, torch.Tensor], num_layers: int, num_experts: int) -> Mapping:
    """Either Mixtral checkpoint layout, as the stacked one: per-expert
    ``block_sparse_moe.experts.{e}.w1/w2/w3`` (what ``save_pretrained`` writes) become
    ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` (w1 rows, then w3) and ``mlp.experts.down_proj``
    ``[E, H, I]``; a checkpoint already stacked passes through."""
    return _StackedExperts(state_dict, num_layers, num_experts)
