"""Where kernel tests run: compiled on CUDA when the machine has a GPU, through the Triton interpreter otherwise
(``conftest.py`` sets ``TRITON_INTERPRET=1`` before any kernel module loads). Every tensor a kernel test hands to
a kernel is made on ``KERNEL_DEVICE``; tolerances may differ by device (``ON_GPU``)."""

from __future__ import annotations

import torch

ON_GPU = torch.cuda.is_available()
KERNEL_DEVICE = torch.device("cuda" if ON_GPU else "cpu")
