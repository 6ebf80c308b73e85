"""Shared fixtures. ``--impl labs`` grades the learner's labs/ package with the very same tests.

On a machine without CUDA, Triton kernels run through the interpreter: TRITON_INTERPRET must be set
before any kernel module is imported, so it is set here, first.
"""

from __future__ import annotations

import importlib
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--impl", default="solutions", choices=["solutions", "labs"], help="which package to grade (default: solutions)"
    )


@pytest.fixture(scope="session")
def impl_name(request) -> str:
    return request.config.getoption("--impl")


@pytest.fixture(scope="session")
def load(impl_name):
    """``load("model.llama")`` imports that module from the package under test."""
    return lambda module: importlib.import_module(f"{impl_name}.{module}")


@pytest.fixture(scope="session")
def llm(load):
    """The engine on the bundled model, float32 on CPU (shared by every test in the session)."""
    return load("llm").LLM(device="cpu", dtype="float32", max_num_seqs=8, max_model_len=1024)


@pytest.fixture(scope="session")
def hf_oracle():
    """Hugging Face transformers loading the same GGUF in float32: the model and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    from solutions.model.loader import bundled_model_path

    logging.set_verbosity_error()
    path = bundled_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval(), tokenizer
