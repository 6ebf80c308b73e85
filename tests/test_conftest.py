"""The shared test machinery in ``conftest.py``: a missing bundled model skips the tests that need it (with
that reason) instead of failing them, whichever way they load it; any other error still fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

NEEDS_MODEL = """
import pytest

from solutions.model.loader import bundled_model_path


@pytest.fixture(scope="module")
def engine():
    return bundled_model_path()


def test_module_fixture_loads_it(engine):
    pass


def test_body_loads_it():
    bundled_model_path()


def test_session_llm_fixture(llm):
    pass


@pytest.mark.needs_model
def test_marked():
    pass


def test_another_missing_file_still_fails():
    raise FileNotFoundError("data/some_table.csv")
"""

# Loaded with -p before the conftest: the bundled model's package name points at nothing.
HIDE_MODEL = 'import solutions.model.loader as loader\n\nloader.BUNDLED_PACKAGE = "no_such_bundled_model"\n'


def test_missing_bundled_model_skips_with_its_reason(tmp_path):
    for name in ("conftest.py", "kernel_device.py", "tiny_models.py"):  # conftest imports the other two
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_needs_model.py").write_text(NEEDS_MODEL)
    (tmp_path / "hide_model.py").write_text(HIDE_MODEL)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(TESTS.parent)])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "hide_model",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout
    assert "1 failed, 4 skipped" in out, (
        f"expected the four model tests skipped, the other failing:\n{out[-3000:]}"
    )
    assert out.count("bundled model not installed") == 4, f"each skip must give the reason:\n{out[-3000:]}"
