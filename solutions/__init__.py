"""Fast Mode: a small, fast LLM inference engine built lesson by lesson.

from solutions import LLM, SamplingParams
llm = LLM()                                   # the bundled SmolLM2-135M-Instruct
out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=16))
print(out[0].outputs[0].text, out[0].metrics.summary())
"""

import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    # Without a GPU, Triton kernels run only through its interpreter, which must be chosen before the first
    # import of triton.language (a kernel module imported later cannot switch it).
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .config import EngineConfig
from .engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from .engine.sampling_params import SamplingParams
from .llm import LLM

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "EngineConfig"]
