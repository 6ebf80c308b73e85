"""Grade one lab alone: ``make grade LAB=N`` runs the tests marked ``labN`` on labs/, short and pointed.

Only Lab N's files come from labs/ while it is graded (``FASTMODE_LAB_ALONE=N``, see ``solutions/course.py``):
every other lab's module is its solutions/ twin, so an unfinished Lab 1 never fails Lab 2's tests. The report
is a few lines, not tracebacks: one line per hole still to write (naming it, and how many tests wait on it),
one per distinct failure of the code written so far (the test's message, which names the likely cause, and
where in labs/ it failed), then what passing means for the notebook and for ``from labs import LLM``.
``--verbose`` runs the same tests with pytest's own output instead (short tracebacks).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import Phase, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's labs/ and solutions/ first, whatever else is on the path
import make_labs  # noqa: E402  (tools/ is this script's own folder)

MAX_FAILURE_LINES = 12


@dataclass
class Failure:
    """One failing test: which, why (the exception's first line) and where in
    labs/ it was raised, if there."""

    test: str
    message: str
    where: str = ""


@dataclass
class Outcome:
    """What the run found: tests passed, tests waiting on each unwritten hole, other failures."""

    passed: int = 0
    waiting: dict[str, list[str]] = field(default_factory=dict)  # a hole's nudge -> the tests that hit it
    failures: list[Failure] = field(default_factory=list)
    unloadable: list[Failure] = field(default_factory=list)  # test files that failed to import


class Collector:
    """A pytest plugin that sorts each failure: a hole still raising, or a real failure with its message."""

    def __init__(self, labs_dir: Path):
        self.labs_dir, self.outcome = labs_dir, Outcome()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = (yield).get_result()
        name = item.nodeid.split("::", 1)[-1]
        if report.passed and report.when == "call":
            self.outcome.passed += 1
        elif report.failed and call.excinfo is not None:
            error = call.excinfo.value
            if nudge := hole_behind(error):
                self.outcome.waiting.setdefault(nudge, []).append(name)
            else:
                self.outcome.failures.append(Failure(name, first_lines(error), self.where(call.excinfo)))

    def pytest_collectreport(self, report):
        if report.failed:
            lines = str(report.longrepr).strip().splitlines()
            message = " ".join(lines[-1].removeprefix("E").split()) if lines else "?"
            self.outcome.unloadable.append(Failure(report.nodeid or "collection", message))

    def where(self, excinfo) -> str:
        """The last frame of the traceback inside labs/: the learner's line that raised."""
        for entry in reversed(excinfo.traceback):
            path = Path(str(entry.path))
            if path.is_relative_to(self.labs_dir):
                return f"labs/{path.relative_to(self.labs_dir)}:{entry.lineno + 1}"
        return ""


def hole_behind(error: BaseException) -> str | None:
    """The message of the unwritten hole that ``error`` comes from, if any: a ``Lab N: ...``
    NotImplementedError, itself, as the cause of another error, inside an exception group (hypothesis), or
    quoted in the text of Triton's interpreter error."""
    todo, seen = [error], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, NotImplementedError) and make_labs.LAB_NUMBER.match(str(current)):
            return str(current)
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += list(getattr(current, "exceptions", ()))
    quoted = re.search(r"""NotImplementedError\((['"])(Lab \w+:.*?)\1\)""", str(error))
    return quoted[2] if quoted else None


def first_lines(error: BaseException, limit: int = 300) -> str:
    """An assertion's own message (without pytest's rewritten expression when there is one), else type: text.
    An exception group (hypothesis's distinct failures) speaks through its first member."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    text = str(error).strip()
    if isinstance(error, AssertionError):
        message = text.split("\nassert ")[0].strip()
        text = (
            message if message and not message.startswith("assert ") else text.splitlines()[0] if text else ""
        )
        text = text or "assertion failed (no message)"
    else:
        text = f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unwritten_holes(lab: str | None = None) -> tuple[list[make_labs.Hole], list[Path]]:
    """Holes (of ``lab``, or of every lab) that still raise in labs/, and labs/ files that are out of date."""
    state = make_labs.labs_state()
    holes, stale = [], []
    for path, parts in make_labs.lab_parts().items():
        file_holes = [p for p in parts if isinstance(p, make_labs.Hole) and lab in (None, p.lab)]
        if not file_holes:
            continue
        if path in state.stale:
            stale.append(path)
            continue
        filled = {h.line for h in state.filled.get(path, [])}
        holes += [h for h in file_holes if h.line not in filled]
    return holes, stale


def engine_labs() -> tuple[list[str], list[str]]:
    """The labs whose modules ``from labs import LLM`` imports (module level, from llm.py on), and the labs
    loaded only inside a function (an option that needs them: quantization, the Triton backend, ...)."""
    lab_of_module = {
        ".".join(Path(p.path).relative_to("solutions").with_suffix("").parts): p.lab
        for p in make_labs.all_holes()
    }
    always = import_closure("llm", module_level_only=True)
    anywhere = import_closure("llm", module_level_only=False)
    labs_of = lambda modules: sorted(
        {lab_of_module[m] for m in modules if m in lab_of_module}, key=int_or_text
    )
    return labs_of(always), [lab for lab in labs_of(anywhere) if lab not in labs_of(always)]


def import_closure(start: str, module_level_only: bool) -> set[str]:
    """Every solutions module that importing ``start`` imports (relative imports), dotted from the package."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen or module_path(module) is None:
            continue
        seen.add(module)
        todo += [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]  # its packages
        todo += relative_imports(module, module_level_only)
    return seen


def module_path(module: str) -> Path | None:
    base = make_labs.SOURCE.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.exists():
            return path
    return None


def relative_imports(module: str, module_level_only: bool) -> set[str]:
    path = module_path(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and module_level_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                parts = package.split(".") if package else []
                base = parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else [])
                for alias in node.names:
                    candidate = ".".join([*base, alias.name])
                    found.add(candidate if module_path(candidate) else ".".join(base))
            visit(ast.iter_child_nodes(node))

    visit(ast.parse(path.read_text()).body)
    return found


def int_or_text(lab: str) -> tuple[int, str]:
    return (int(lab), "") if lab.isdigit() else (10**6, lab)


def labs_line(labs: list[str]) -> str:
    return ("Lab " if len(labs) == 1 else "Labs ") + ", ".join(labs)


def report(lab: str, outcome: Outcome, holes: list[make_labs.Hole], stale: list[Path]) -> list[str]:
    """The grader's few lines: unwritten holes, failures, and what passing unlocks."""
    total = outcome.passed + sum(map(len, outcome.waiting.values())) + len(outcome.failures)
    lines = [f"Lab {lab}: {outcome.passed} of {total} tests pass (other labs' code taken from solutions/)"]
    for failure in outcome.unloadable:
        lines.append(f"  could not load {failure.test} (its lab{lab} tests did not run): {failure.message}")
    for path in stale:
        lines.append(
            f"  {path.relative_to(ROOT)} differs from its generated file outside the holes: `make labs`"
        )
    nudges = {h.nudge: h for h in make_labs.all_holes()}
    for hole in holes:
        waiting = next(
            (tests for nudge, tests in outcome.waiting.items() if nudge.startswith(hole.nudge)), []
        )
        tests = (
            f"{len(waiting)} test{' waits' if len(waiting) == 1 else 's wait'} on it"
            if waiting
            else "no test reached it"
        )
        lines.append(
            f"  to write: {hole.function:<32} labs/{hole.path.removeprefix('solutions/')}  ({tests})"
        )
    for nudge, tests in outcome.waiting.items():  # a hole of another lab (a labs/ file changed by hand?)
        if not any(nudge.startswith(h.nudge) for h in holes):
            hole = next((h for n, h in nudges.items() if nudge.startswith(n)), None)
            name = f"{hole.function} (Lab {hole.lab})" if hole else nudge[:60]
            lines.append(f"  {len(tests)} test(s) reached {name}, which still raises NotImplementedError")
    shown: dict[str, list[Failure]] = {}
    for failure in outcome.failures:  # cases failing alike (the same message, figures aside) share one line
        shown.setdefault(re.sub(r"[-+]?\d[\d.e+-]*", "#", failure.message), []).append(failure)
    for failures in list(shown.values())[:MAX_FAILURE_LINES]:
        names = failures[0].test + (f" (+{len(failures) - 1} alike)" if len(failures) > 1 else "")
        where = f" [{failures[0].where}]" if failures[0].where else ""
        lines.append(f"  FAILED {names}{where}: {failures[0].message}")
    if len(shown) > MAX_FAILURE_LINES:
        lines.append(f"  ... {len(shown) - MAX_FAILURE_LINES} more kinds of failure")
    if outcome.failures:
        lines.append(f"  tracebacks: make grade LAB={lab} VERBOSE=1")
    if holes and not outcome.failures:
        lines.append(f"  stuck? make hint LAB={lab} (TIER=2, 3 for more)")
    if total and outcome.passed == total and not holes and not stale and not outcome.unloadable:
        lines += passed_lines(lab)
    return lines


def passed_lines(lab: str) -> list[str]:
    notebook = next(iter(sorted((ROOT / "notebooks").glob(f"{lab.zfill(2)}_*.ipynb"))), None)
    lines = [
        f"Lab {lab} passes."
        + (f' IMPL = "labs" in {notebook.name} now runs your Lab {lab} code.' if notebook else "")
    ]
    always, optional = engine_labs()
    todo = {h.lab for h in unwritten_holes()[0]}
    missing = [n for n in always if n in todo]
    uses = f"`from labs import LLM` loads your code of {labs_line(always)}"
    if optional:
        uses += f", and of {labs_line(optional)} when an option asks for them"
    lines.append(uses + (f"; still to write: {labs_line(missing)}." if missing else "; all written."))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lab", help="the lab's number")
    parser.add_argument("--verbose", action="store_true", help="pytest's own output, with short tracebacks")
    # The rest goes to pytest: -k fork, or test files to run instead of all of tests/.
    args, pytest_extra = parser.parse_known_args(argv)
    labs = sorted({h.lab for h in make_labs.all_holes()}, key=int_or_text)
    if args.lab not in labs:
        print(f"no lab {args.lab}: the labs are {', '.join(labs)}")
        return 2
    os.environ[make_labs.LAB_ALONE_ENV] = args.lab
    named = [a for a in pytest_extra if not a.startswith("-") and (ROOT / a.split("::")[0]).exists()]
    pytest_args = [*([] if named else [str(ROOT / "tests")]), "--impl", "labs", "-m", f"lab{args.lab}"]
    pytest_args += ["-p", "no:cacheprovider"]
    pytest_args.append(
        "--continue-on-collection-errors"
    )  # a broken test file must not hide the others' results
    pytest_extra = [str(ROOT / a) if a in named else a for a in pytest_extra]
    pytest_args += ["--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *pytest_extra]
    if args.verbose:
        return pytest.main([*pytest_args, "-q", "--tb=short", "--no-header", "-p", "no:warnings"])
    # The report shows each failure's message, not hypothesis's smallest failing example: skip the search for
    # it (minutes on a state machine); VERBOSE=1 keeps it.
    settings.register_profile("grade", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    settings.load_profile("grade")
    collector = Collector(make_labs.TARGET)
    status = pytest.main([*pytest_args, "-p", "no:terminal", "-p", "no:warnings"], plugins=[collector])
    holes, stale = unwritten_holes(args.lab)
    print("\n".join(report(args.lab, collector.outcome, holes, stale)))
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"no test is marked lab{args.lab} (pyproject.toml registers the markers)")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
