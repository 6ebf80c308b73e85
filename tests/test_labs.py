"""The lab mechanism: labs/ is generated from solutions/ and its exercises are really holes."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def test_labs_are_in_sync_with_solutions():
    result = subprocess.run([sys.executable, "tools/make_labs.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_marker_blocks_become_not_implemented():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        make_labs = importlib.import_module("make_labs")
    finally:
        sys.path.pop(0)
    source = "def f(x):\n    # BEGIN SOLUTION Lab 9: return x doubled\n    return 2 * x\n    # END SOLUTION\n"
    assert (
        make_labs.strip_solutions(source, "f.py")
        == "def f(x):\n    raise NotImplementedError('Lab 9: return x doubled')\n"
    )
    with pytest.raises(ValueError, match="never closed"):
        make_labs.strip_solutions("# BEGIN SOLUTION\nx = 1\n", "g.py")


def test_lab0_exercises_are_holes_in_labs():
    llama = importlib.import_module("labs.model.llama")
    attention = importlib.import_module("labs.kernels.attention")
    x = torch.ones(2, 8)
    with pytest.raises(NotImplementedError, match="Lab 0"):
        llama.rms_norm(x, torch.ones(8), 1e-5)
    with pytest.raises(NotImplementedError, match="Lab 0"):
        llama.apply_rope(torch.ones(2, 1, 8), torch.ones(2, 8), torch.zeros(2, 8))
    with pytest.raises(NotImplementedError, match="Lab 0"):
        attention.gqa_attention(torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), causal=False)


def test_labs_engine_runs_on_the_learners_modules():
    """Only exercise files live in labs/; the rest of the engine is solutions' code, wired to them."""
    engine = importlib.import_module("labs.engine.engine")
    manager = importlib.import_module("labs.cache.kv_cache_manager")
    assert engine.KVCacheManager is manager.KVCacheManager, "the labs engine must run the learner's KV-cache manager"
    assert Path(manager.__file__).is_relative_to(ROOT / "labs")
    assert Path(engine.__file__).is_relative_to(ROOT / "solutions")
