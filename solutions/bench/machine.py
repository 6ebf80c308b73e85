"""Which machine a figure was measured on, named the same way by every benchmark and notebook."""

from __future__ import annotations

import torch

from ..kernels.cpu_linear import cpu_model


def machine_name(device: str | torch.device | None = None) -> str:
    """The GPU's name for a CUDA ``device`` (default: CUDA when there is a GPU), else the CPU's model and the
    threads torch runs on it."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_model()} (CPU, {torch.get_num_threads()} threads)"
