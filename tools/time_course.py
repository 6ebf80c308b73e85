"""Time a learner's path through the course on this machine, and write the table into CONTRIBUTING.md.

What is timed, each in a fresh process from the repository root, as a learner meets it:

- each notebook, run top to bottom under ``pytest --nbval-lax`` (what ``make test`` runs; as long as running
  it in JupyterLab, minus the reading);
- each lab's grader twice: ``tools/grade.py N`` on labs/ as shipped (what ``make grade LAB=N`` prints before
  any code is written: the holes, quickly), and the tests it runs once the lab is written, that is
  ``pytest -m labN --impl solutions`` on the reference code (the grader's run on a finished lab, whose tests
  then all run; ``make grade`` on labs/ runs the same tests, under ``FASTMODE_LAB_ALONE=N``).

Each figure is a wall time and a CPU time (of the command and of every process it waited for); the machine
(``lscpu``'s model name and CPU count) goes beside the table. Times are kept in ``results/course_times.json``,
so that a run of some of the items (``--notebooks 07 09 --labs``: two notebooks, no lab) updates only those
rows; ``--write`` only renders the kept times into CONTRIBUTING.md between its two markers, and ``--shared``
says that other jobs shared the machine while the run's items ran (kept with each item, marked in the table).

A notebook is over the budget (``LIMIT_S``, 3 minutes) when a learner on a quiet 2-core machine would wait
longer: its wall time when it ran on a quiet machine, its CPU time when it ran on a shared one (the wall time
then counts the other jobs; the CPU time, both cores' work, is at least the quiet wall time).

    python tools/time_course.py                 # everything, then --write
    python tools/time_course.py --notebooks 07 --labs   # notebook 07 only, no lab
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMES = ROOT / "results" / "course_times.json"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
BEGIN, END = "<!-- course times: begin (tools/time_course.py --write) -->", "<!-- course times: end -->"
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LABS = ["0", "1", "2", "3", "4", "5", "6", "7", "9"]
LIMIT_S = 3 * 60  # CONTRIBUTING's budget for a notebook on a quiet 2-core CPU


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str]) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (the command and every process it waited for: a notebook's kernel), the exit
    status and the output's last line."""
    start, cpu = time.perf_counter(), children_cpu_s()
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    tail = (run.stdout + run.stderr).strip().splitlines()
    return time.perf_counter() - start, children_cpu_s() - cpu, run.returncode, tail[-1] if tail else ""


def machine() -> str:
    """``lscpu``'s model name and CPU count, e.g. 'Intel(R) Xeon(R) ... , 2 CPUs'."""
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return f"{fields.get('Model name', '?')}, {fields.get('CPU(s)', '?')} CPUs"


def time_notebook(name: str) -> dict:
    seconds, cpu, status, last = timed(
        [sys.executable, "-m", "pytest", "--nbval-lax", f"notebooks/{name}", "-q", "-p", "no:cacheprovider"]
    )
    return {"seconds": seconds, "cpu_seconds": cpu, "passed": status == 0, "last_line": last}


def time_lab(lab: str) -> dict:
    holes_s, holes_cpu, _, holes_last = timed([sys.executable, "tools/grade.py", lab])
    tests = ["tests/", "-q", "-m", f"lab{lab}", "--impl", "solutions", "-p", "no:cacheprovider"]
    tests_s, tests_cpu, status, last = timed([sys.executable, "-m", "pytest", *tests])
    return {
        "holes_seconds": holes_s,
        "holes_cpu_seconds": holes_cpu,
        "holes_last_line": holes_last,
        "tests_seconds": tests_s,
        "tests_cpu_seconds": tests_cpu,
        "passed": status == 0,
        "last_line": last,
    }


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def row(step: str, what: str, wall: float, cpu: float, note: str = "") -> str:
    return f"| {step} | {what} | {minutes(wall)} | {minutes(cpu)} | {note} |"


def over_budget(t: dict) -> str:
    """The budget note of a notebook's times ``t``: ``LIMIT_S`` of wall time on a quiet machine, of CPU time
    on a shared one."""
    if t["shared"]:
        return "over 3 min of CPU" if t["cpu_seconds"] > LIMIT_S else ""
    return "over 3 min" if t["seconds"] > LIMIT_S else ""


def table(times: dict) -> str:
    notebooks, labs = times.get("notebooks", {}), times.get("labs", {})
    shared = any(t["shared"] for t in (*notebooks.values(), *labs.values()))
    lines = [
        BEGIN,
        "",
        f"Measured on {times.get('machine', '?')}, {times.get('date', '?')}"
        + (
            ". Rows marked *shared* ran while **other jobs shared the machine**, so their wall times are "
            "longer than a quiet machine's; the CPU time (the command and the processes it waited for, a "
            "notebook's kernel included) moves less with the load."
            if shared
            else ", nothing else running."
        )
        + " A notebook's CPU time can pass its wall time: its kernel and the engine use both cores.",
        "",
        "| step | what runs | wall time | CPU time | |",
        "|---|---|---|---|---|",
    ]
    for name in NOTEBOOKS:
        if name in notebooks:
            t = notebooks[name]
            note = ", ".join(n for n in ("shared" if t["shared"] else "", over_budget(t)) if n)
            note = note if t["passed"] else "FAILED: " + t["last_line"]
            lines.append(
                row(f"`{name}`", "the notebook, top to bottom (nbval)", t["seconds"], t["cpu_seconds"], note)
            )
    for lab in LABS:
        if lab in labs:
            t = labs[lab]
            what = f"`make grade LAB={lab}` on the shipped holes"
            note = "shared" if t["shared"] else ""
            lines.append(row(f"Lab {lab}", what, t["holes_seconds"], t["holes_cpu_seconds"], note))
            note = note if t["passed"] else "FAILED: " + t["last_line"]
            what = f"its graded tests once written (`pytest -m lab{lab} --impl solutions`)"
            lines.append(row(f"Lab {lab}", what, t["tests_seconds"], t["tests_cpu_seconds"], note))
    wall_nb = sum(t["seconds"] for t in notebooks.values())
    cpu_nb = sum(t["cpu_seconds"] for t in notebooks.values())
    wall_labs = sum(t["tests_seconds"] for t in labs.values())
    lines += [
        "",
        f"In all: {minutes(wall_nb)} of notebooks ({minutes(cpu_nb)} of CPU) and {minutes(wall_labs)} of "
        "grading each lab once it is written, beside the learner's reading and writing.",
        "",
        END,
    ]
    return "\n".join(lines)


def write_contributing(times: dict) -> None:
    text = CONTRIBUTING.read_text()
    block = table(times)
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n## A learner's path, timed\n\n" + block + "\n"
    CONTRIBUTING.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="*", help="notebook numbers (default: all; none: no notebook)")
    parser.add_argument("--labs", nargs="*", help="lab numbers (default: all; none: no lab)")
    parser.add_argument(
        "--write", action="store_true", help="only render the kept times into CONTRIBUTING.md"
    )
    parser.add_argument(
        "--shared", action="store_true", help="other jobs share the machine while this run's items run"
    )
    args = parser.parse_args()
    times = json.loads(TIMES.read_text()) if TIMES.exists() else {}
    if not args.write:
        notebooks = NOTEBOOKS if args.notebooks is None else [n for n in NOTEBOOKS if n[:2] in args.notebooks]
        labs = LABS if args.labs is None else [lab for lab in LABS if lab in args.labs]
        times["machine"] = machine()
        times["date"] = datetime.now(UTC).strftime("%Y-%m-%d")
        for name in notebooks:
            times.setdefault("notebooks", {})[name] = result = {**time_notebook(name), "shared": args.shared}
            status = "" if result["passed"] else " FAILED"
            print(
                f"{name}: {minutes(result['seconds'])}, CPU {minutes(result['cpu_seconds'])}{status}",
                flush=True,
            )
            TIMES.write_text(json.dumps(times, indent=1) + "\n")
        for lab in labs:
            times.setdefault("labs", {})[lab] = result = {**time_lab(lab), "shared": args.shared}
            tests = minutes(result["tests_seconds"])
            print(f"Lab {lab}: holes {minutes(result['holes_seconds'])}, tests {tests}", flush=True)
            TIMES.write_text(json.dumps(times, indent=1) + "\n")
    write_contributing(times)
    print(table(times))


if __name__ == "__main__":
    main()
