"""Fast Mode: a small, fast LLM inference engine built lesson by lesson.

from solutions import LLM, SamplingParams
llm = LLM()                                   # the bundled SmolLM2-135M-Instruct
out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
print(out[0].outputs[0].text, out[0].metrics.summary())
"""

import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    # Without a GPU, Triton kernels run only through its interpreter. Triton reads TRITON_INTERPRET when a
    # kernel is defined (@triton.jit, at its module's import), so the package decides here, before any kernel
    # module loads; tools/make_labs.py copies this file into labs/__init__.py, so `import labs` decides it
    # too. Every kernel module is then imported like any other module.
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .config import EngineConfig
from .engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from .llm import LLM
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "EngineConfig"]
