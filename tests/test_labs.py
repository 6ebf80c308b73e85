"""The lab mechanism: labs/ is generated from solutions/, its exercises are really holes,
and `make lab` opens.

``make test`` (the maintainers' suite, what CI runs) requires labs/ to be exactly the generated holes. A
learner who has filled some in runs ``make check``, which sets FASTMODE_ALLOW_FILLED_LABS=1: filled holes are
then their work, not a failure, while a difference outside the holes still fails.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
ALLOW_FILLED = os.environ.get("FASTMODE_ALLOW_FILLED_LABS") == "1"


def make_labs():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        return importlib.import_module("make_labs")
    finally:
        sys.path.pop(0)


def test_labs_are_in_sync_with_solutions():
    command = [sys.executable, "tools/make_labs.py", "--check", *(["--allow-filled"] if ALLOW_FILLED else [])]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_marker_blocks_become_not_implemented():
    strip = make_labs().strip_solutions
    source = "def f(x):\n    # BEGIN SOLUTION Lab 9: return x doubled\n    return 2 * x\n    # END SOLUTION\n"
    assert strip(source, "f.py") == "def f(x):\n    raise NotImplementedError('Lab 9: return x doubled')\n"
    with pytest.raises(ValueError, match="never closed"):
        strip("# BEGIN SOLUTION\nx = 1\n", "g.py")
    with pytest.raises(ValueError, match="without BEGIN"):
        strip("x = 1\n# END SOLUTION\n", "h.py")


def test_hints_are_tiered_and_never_reach_labs():
    tool = make_labs()
    source = (
        "def f(x):\n"
        "    # BEGIN SOLUTION Lab 9: double it\n"
        "    # HINT: multiply by a small\n"
        "    #  integer\n"
        "    # HINT: the integer is 2\n"
        "    # a comment of the solution, not a hint\n"
        "    return 2 * x\n"
        "    # END SOLUTION\n"
    )
    _, hole, _ = tool.split_solutions(source, "f.py")
    assert (hole.lab, hole.function) == ("9", "f")
    assert hole.hints == ["multiply by a small integer", "the integer is 2"]
    lab = tool.strip_solutions(source, "f.py")
    assert lab == "def f(x):\n    raise NotImplementedError('Lab 9: double it (hints: make hint LAB=9)')\n"


def test_a_long_nudge_continues_on_the_next_comment_line():
    """A ``#`` + two spaces line right under ``BEGIN SOLUTION`` continues the nudge (keeps lines <= 110);
    hints after it still parse, and a one-space comment is the solution's own."""
    tool = make_labs()
    source = (
        "def f(x):\n"
        "    # BEGIN SOLUTION Lab 9: double\n"
        "    #  it\n"
        "    # HINT: the integer is 2\n"
        "    #  (not 3)\n"
        "    # a comment of the solution\n"
        "    return 2 * x\n"
        "    # END SOLUTION\n"
    )
    _, hole, _ = tool.split_solutions(source, "f.py")
    assert hole.nudge == "Lab 9: double it" and hole.hints == ["the integer is 2 (not 3)"]
    lab = tool.strip_solutions(source, "f.py")
    assert lab == "def f(x):\n    raise NotImplementedError('Lab 9: double it (hints: make hint LAB=9)')\n"


def test_filled_holes_are_told_apart_from_stale_files():
    tool = make_labs()
    source = (
        "def f(x):\n    # BEGIN SOLUTION Lab 9: double it\n    return 2 * x\n    # END SOLUTION\n\n\ny = 1\n"
    )
    parts = tool.split_solutions(source, "f.py")
    generated = tool.render(parts)
    assert tool.filled_holes(parts, generated) == []
    filled = generated.replace(
        "    raise NotImplementedError('Lab 9: double it')\n", "    y = x + x\n    return y\n"
    )
    assert [h.function for h in tool.filled_holes(parts, filled)] == ["f"]
    assert tool.filled_holes(parts, filled.replace("y = 1", "y = 2")) is None  # edited outside the hole
    assert (
        tool.filled_holes(parts, generated.replace("double it", "old nudge")) is None
    )  # a hole with a stale nudge


def lab_is_filled(lab: str) -> bool:
    return any(h.lab == lab for holes in make_labs().labs_state().filled.values() for h in holes)


def test_lab0_exercises_are_holes_in_labs():
    if ALLOW_FILLED and lab_is_filled("0"):
        pytest.skip("Lab 0 holds your code: `make grade LAB=0` grades it")
    llama = importlib.import_module("labs.model.llama")
    attention = importlib.import_module("labs.kernels.attention")
    x = torch.ones(2, 8)
    with pytest.raises(NotImplementedError, match="Lab 0"):
        llama.rms_norm(x, torch.ones(8), 1e-5)
    with pytest.raises(NotImplementedError, match="Lab 0"):
        llama.apply_rope(torch.ones(2, 1, 8), torch.ones(2, 8), torch.zeros(2, 8))
    with pytest.raises(NotImplementedError, match="Lab 0"):
        attention.gqa_attention(
            torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), torch.ones(1, 1, 1, 8), causal=False
        )


def test_every_hole_has_a_lab_with_a_grader():
    """Each ``Lab N`` marker names a lab that pyproject registers as marker ``labN``,
    so `make grade` finds it."""
    markers = (ROOT / "pyproject.toml").read_text()
    for hole in make_labs().all_holes():
        assert f'"lab{hole.lab}:' in markers, (
            f"{hole.path}:{hole.line}: no pytest marker lab{hole.lab} in pyproject"
        )


def test_labs_engine_runs_on_the_learners_modules():
    """Only exercise files live in labs/; the rest of the engine is solutions' code, wired to them."""
    quant_model = importlib.import_module(
        "labs.quant.model"
    )  # no lab in it: solutions' file, loaded as labs'
    awq = importlib.import_module("labs.quant.awq")  # holds Lab 6: the learner's file
    assert quant_model.clip_ratios is awq.clip_ratios
    assert Path(awq.__file__).is_relative_to(ROOT / "labs")
    assert Path(quant_model.__file__).is_relative_to(ROOT / "solutions")

    engine = importlib.import_module("labs.engine.engine")
    manager = importlib.import_module("labs.cache.kv_cache_manager")
    assert engine.KVCacheManager is manager.KVCacheManager, (
        "the labs engine must run the learner's KV-cache manager"
    )
    assert Path(manager.__file__).is_relative_to(ROOT / "labs")
    assert Path(engine.__file__).is_relative_to(ROOT / "solutions")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.mark.slow
def test_make_lab_serves_the_course(tmp_path):
    """`make lab` (root included) starts JupyterLab;
    it answers with notebook 00 and the course's kernel, then stops."""
    port, token = free_port(), "fastmode-test"
    venv = Path(sys.executable).parent.parent
    args = (
        f"--no-browser --ip=127.0.0.1 --port={port} --ServerApp.port_retries=0 "
        f"--IdentityProvider.token={token}"
    )
    log = (tmp_path / "jupyter.log").open("w")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    # -o setup: the venv running these tests is already set up; `make lab` must not reinstall it.
    server = subprocess.Popen(
        ["make", "--no-print-directory", "-o", "setup", "lab", f"VENV={venv}", f"LAB_ARGS={args}"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get_json(f"{base}/status?token={token}")
                break
            except OSError:
                output = (tmp_path / "jupyter.log").read_text()
                assert server.poll() is None, f"`make lab` exited with {server.returncode}:\n{output[-2000:]}"
                assert time.monotonic() < deadline, (
                    f"JupyterLab did not answer within 90 s:\n{output[-2000:]}"
                )
                time.sleep(0.5)
        notebook = get_json(f"{base}/contents/notebooks/00_tour.ipynb?content=1&token={token}")
        assert notebook["type"] == "notebook"
        kernel = notebook["content"]["metadata"]["kernelspec"]["name"]
        specs = get_json(f"{base}/kernelspecs?token={token}")["kernelspecs"]
        assert kernel in specs, f"notebook 00 asks for kernel {kernel!r}; the server offers {sorted(specs)}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()


# -------------------------------------------------------------- one lab alone, and the notebooks' IMPL switch


def test_holes_are_named_by_class_and_method_and_keep_their_reference_code():
    tool = make_labs()
    source = (
        "class Pool:\n"
        "    def take(\n"
        "        self, n\n"
        "    ):\n"
        "        # BEGIN SOLUTION Lab 9: take n\n"
        "        # HINT: the idea\n"
        "        return n\n"
        "        # END SOLUTION\n"
        "\n"
        "\n"
        "def free():\n"
        "    # BEGIN SOLUTION Lab 9: free\n"
        "    pass\n"
        "    # END SOLUTION\n"
    )
    parts = tool.split_solutions(source, "pool.py")
    holes = [p for p in parts if isinstance(p, tool.Hole)]
    assert [h.function for h in holes] == ["Pool.take", "free"]
    assert holes[0].body == "        return n\n", "the reference code without its hint lines"
    solved = tool.render(parts, frozenset({"9"}))
    assert (
        "return n" in solved
        and "pass" in solved
        and "NotImplementedError" not in solved
        and "HINT" not in solved
    )
    with pytest.raises(ValueError, match="one lab's holes"):
        tool.split_solutions(source.replace("Lab 9: free", "Lab 8: free"), "mixed.py")


def test_the_generated_labs_package_knows_each_modules_lab():
    tool = make_labs()
    init = tool.lab_files()[tool.TARGET / "__init__.py"]
    for hole in tool.all_holes():
        module = ".".join(Path(hole.path).relative_to("solutions").with_suffix("").parts)
        assert f'"{module}": "{hole.lab}"' in init, f"labs/__init__.py's LAB_OF_MODULE lacks {module}"
    from solutions import course

    assert tool.LAB_ALONE_ENV == course.LAB_ALONE_ENV == "FASTMODE_LAB_ALONE"


LAB_ALONE_PROBE = """
import sys
from pathlib import Path

from solutions.course import implementation

labs = implementation("labs", lab=2)
origin = lambda name: Path(labs.module(name).__file__).parts[-3]
print(origin("cache.kv_cache_manager"), origin("kernels.paged_attention"), origin("kernels.flash_attention"),
      origin("model.llama"),
      labs.module("engine.engine").KVCacheManager is labs.module("cache.kv_cache_manager").KVCacheManager)
for request in ({"impl": "labs", "lab": 3}, {"impl": "labs"}, {"impl": "lab"}):
    try:
        implementation(**request)
    except (RuntimeError, ValueError) as error:
        print(type(error).__name__, error)
"""


def test_a_lab_alone_takes_every_other_labs_module_from_solutions():
    """With Lab 2 alone, Lab 2's files are the learner's and Lab 1's and Lab 0's load their solutions
    twins, still as part of the labs package (one set of classes); asking for another choice in the same
    process is refused."""
    env = {k: v for k, v in os.environ.items() if k != "FASTMODE_LAB_ALONE"}
    result = subprocess.run(
        [sys.executable, "-c", LAB_ALONE_PROBE], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["labs", "labs", "solutions", "solutions", "True"], lines[0]
    assert (
        lines[1].startswith("RuntimeError") and "Lab 2 alone" in lines[1] and "restart the kernel" in lines[1]
    )
    assert lines[2].startswith("RuntimeError") and "every lab" in lines[2]
    assert lines[3].startswith("ValueError") and "IMPL must be one of" in lines[3]


FIRST_CELLS_RUNNER = """
import json
import os
import sys
import types

impl_name, paths = sys.argv[1], sys.argv[2:]
# what a notebook may take from solutions directly
ORACLES = ("solutions.course", "solutions.kernels.reference")
for path in paths:
    for name in [n for n in sys.modules if n == "labs" or n.startswith("labs.")]:
        del sys.modules[name]  # each notebook chooses its own lab
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "SolutionsTwins"]
    cell = next(c for c in json.load(open(path))["cells"] if c["cell_type"] == "code")
    source = "".join(cell["source"])
    assert source.startswith('IMPL = "solutions"'), (
        f"{path}: the first code cell must start with IMPL = \\"solutions\\""
    )
    namespace = {}
    exec(compile(source.replace('IMPL = "solutions"', f'IMPL = "{impl_name}"', 1), path, "exec"), namespace)
    assert "implementation(IMPL" in source, (
        f"{path}: the first cell must take its modules from implementation(IMPL, ...)"
    )
    module_of = lambda value: (
        value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "")
    )
    from_solutions = sorted(
        name for name, value in namespace.items()
        if module_of(value) and module_of(value).startswith("solutions.")
        and not module_of(value).startswith(ORACLES)
    )
    if impl_name == "labs":
        assert not from_solutions, f"{path}: {from_solutions} come from solutions, not from IMPL"
    print("ok", os.path.basename(path))
"""


@pytest.mark.parametrize("impl", ["solutions", "labs"])
def test_every_notebooks_first_cell_runs_under_both_impls(impl):
    """Each notebook's first code cell, with IMPL set to ``impl``, in one process (labs is imported
    afresh for each notebook, as its own kernel would): it runs, and under "labs" binds nothing of
    solutions but the oracles."""
    notebooks = sorted(str(p) for p in (ROOT / "notebooks").glob("*.ipynb"))
    env = {k: v for k, v in os.environ.items() if k != "FASTMODE_LAB_ALONE"}
    env.update(MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-c", FIRST_CELLS_RUNNER, impl, *notebooks],
        cwd=ROOT / "notebooks",
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    finished = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    assert len(finished) == len(notebooks), result.stdout
