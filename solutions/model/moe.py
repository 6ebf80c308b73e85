"""The Mixture-of-Experts MLP a decoder layer uses when its config has experts (Mixtral, the MoE-fied SmolLM2).

    router_logits = gate(x)                                   [T, E]
    weights, experts = route(router_logits, k)                [T, k]
    y = sum_j weights[:, j] * expert_{experts[:, j]}(x)       each expert a SwiGLU FFN of width I

``router == "softmax"`` mixes the chosen experts with renormalised softmax weights (Mixtral);
``router == "unit"`` adds each chosen expert's output in full (MoEfication: the experts partition one
dense FFN's neurons, so choosing all ``E`` gives back the dense FFN exactly).
"""

from __future__ import annotations

import torch
from torch import nn

from ..kernels.moe_gemm import fused_moe
from ..moe.router import route
from .config import ModelConfig


class MoEMLP(nn.Module):
    """Experts stacked for a grouped GEMM: ``w13`` ``[E, 2I, H]`` (gate rows, then up), ``w2`` ``[E, H, I]``."""

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
        return fused_moe(x, self.w13, self.w2, weights.to(x.dtype), routing.experts, self.backend, check_ids=False)


def fuse_moe_experts(state_dict: dict[str, torch.Tensor], layer: int, num_experts: int) -> dict[str, torch.Tensor]:
    """One layer's router and experts, from Hugging Face Mixtral names, as this model's stacked tensors.

    Reads either checkpoint layout: per-expert ``block_sparse_moe.experts.{e}.w1/w2/w3.weight``
    (what ``save_pretrained`` writes) or the stacked ``mlp.experts.gate_up_proj`` / ``down_proj``.
    """
    p = f"model.layers.{layer}."
    out = f"layers.{layer}.mlp."
    if p + "block_sparse_moe.gate.weight" in state_dict:
        moe = p + "block_sparse_moe."
        expert = lambda e, name: state_dict[f"{moe}experts.{e}.{name}.weight"]
        w13 = torch.stack([torch.cat([expert(e, "w1"), expert(e, "w3")]) for e in range(num_experts)])
        w2 = torch.stack([expert(e, "w2") for e in range(num_experts)])
        gate = state_dict[moe + "gate.weight"]
    elif p + "mlp.experts.gate_up_proj" in state_dict:
        w13, w2 = state_dict[p + "mlp.experts.gate_up_proj"], state_dict[p + "mlp.experts.down_proj"]
        gate = state_dict[p + "mlp.gate.weight"]
    else:
        raise ValueError(f"layer {layer} of the checkpoint has no MoE router (block_sparse_moe.gate or mlp.gate)")
    if gate.shape[0] != num_experts or w13.shape[0] != num_experts:
        raise ValueError(f"layer {layer} holds {w13.shape[0]} experts, the config says {num_experts}")
    return {out + "gate.weight": gate, out + "w13": w13, out + "w2": w2}
