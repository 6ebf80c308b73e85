"""Write labs/ from solutions/: each marked block becomes the learner's exercise.

In solutions/, the learner's part of a function is marked::

    # BEGIN SOLUTION Lab 0: normalise by the root mean square (the nudge, shown in the hole)
    # HINT: fuller hint, tier 1 (optional; the learner asks for it with `make hint LAB=0`)
    # HINT: fuller still, tier 2 (`make hint LAB=0 TIER=2`)
    ...reference code...
    # END SOLUTION

and labs/ gets, at the same indentation, ``raise NotImplementedError("Lab 0: normalise ...")``. ``# HINT:``
lines are optional and must come first in the block; a comment line right under one that starts with
``#`` and two spaces continues it, and so does one right under the ``BEGIN SOLUTION`` line (a long nudge).
Hints never reach labs/: the learner opts into them tier by tier.
A file holds the holes of one lab only, so "this module belongs to Lab N" is well defined.

labs/ holds only the files that contain an exercise, plus one small ``__init__.py`` per package on
the way to them. Each of those extends the package's ``__path__`` with its solutions/ twin, so
``import labs.engine.engine`` loads the solution's engine as part of the ``labs`` package, and its
relative imports reach the learner's files wherever a lab exists: the whole engine runs on the
learner's code, with nothing else copied. The top ``labs/__init__.py`` also lists the lab each of its
modules holds (``LAB_OF_MODULE``): with ``FASTMODE_LAB_ALONE=N`` in the environment, only Lab N's modules
come from labs/ and every other one resolves to its solutions/ twin (``solutions/course.py``), so one lab
is graded, and runs in its notebook, on its own.

``--check`` exits 1 if labs/ differs from what this script would write (CI runs it). A learner's
labs/ differs on purpose: holes filled in. Those are told apart from stale files (a difference
outside the holes, or an old nudge), ``--check --allow-filled`` accepts them, and writing refuses to
overwrite filled work unless given ``--force``.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE, TARGET = ROOT / "solutions", ROOT / "labs"
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HINT = re.compile(r"^\s*# HINT:\s*(?P<text>.*)$")
HINT_MORE = re.compile(r"^\s*#  \s*(?P<text>\S.*)$")
LAB_NUMBER = re.compile(r"^Lab (?P<lab>\w+)\s*:")
DEF = re.compile(r"^(?P<indent>\s*)(?:async )?(?:def|class) (?P<name>\w+)")
LAB_ALONE_ENV = "FASTMODE_LAB_ALONE"  # solutions/course.py reads the same variable
HEADER = "# Generated from solutions/{path} by tools/make_labs.py: fill in each NotImplementedError.\n"


@dataclass
class Hole:
    """One marked block: where it is (``function`` qualified by its class: ``KVCacheManager.fork``), the line
    that replaces it in labs/, its opt-in hints, and the reference code it hides (``body``)."""

    path: str
    line: int
    function: str
    indent: str
    nudge: str
    hints: list[str] = field(default_factory=list)
    body: str = ""

    @property
    def lab(self) -> str:
        match = LAB_NUMBER.match(self.nudge)
        return match["lab"] if match else "?"

    @property
    def raise_line(self) -> str:
        """The hole in labs/: the nudge, and where the fuller hints are when the block has some."""
        message = f"{self.nudge} (hints: make hint LAB={self.lab})" if self.hints else self.nudge
        return f"{self.indent}raise NotImplementedError({message!r})\n"


def split_solutions(text: str, path: str) -> list[str | Hole]:
    """The file as alternating kept text and holes: ``[text, Hole, text, Hole, ..., text]``."""
    parts: list[str | Hole] = []
    kept: list[str] = []
    hole: Hole | None = None
    scopes: list[tuple[int, str]] = []  # the enclosing class and def names, with their indentation
    nudge_open = hints_open = False
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        begin = BEGIN.match(line)
        if begin:
            if hole:
                raise ValueError(f"{path}:{number}: BEGIN SOLUTION inside another solution block")
            nudge = begin["hint"] or "fill in this block"
            function = ".".join(name for _, name in scopes) or "<module>"
            hole = Hole(path, number, function, begin["indent"], nudge)
            parts.append("".join(kept))
            kept, nudge_open, hints_open = [], True, True
        elif END.match(line):
            if not hole:
                raise ValueError(f"{path}:{number}: END SOLUTION without BEGIN SOLUTION")
            parts.append(hole)
            hole = None
        elif hole:
            hint = HINT.match(line) if hints_open else None
            more = HINT_MORE.match(line) if hints_open else None
            if more and nudge_open and not hint:
                hole.nudge += " " + more["text"].strip()
                continue
            nudge_open = False
            if hint:
                hole.hints.append(hint["text"].strip())
            elif more and hole.hints and not HINT.match(line):
                hole.hints[-1] += " " + more["text"].strip()
            else:
                hints_open = False
                hole.body += line
        else:
            kept.append(line)
            if line.strip() and line.lstrip()[0] not in "#)]}":  # code at this depth closes deeper scopes
                depth = len(line) - len(line.lstrip())
                scopes = [(indent, name) for indent, name in scopes if indent < depth]
                if match := DEF.match(line):
                    scopes.append((depth, match["name"]))
    if hole:
        raise ValueError(f"{path}: BEGIN SOLUTION is never closed")
    labs = sorted({p.lab for p in parts if isinstance(p, Hole)})
    if len(labs) > 1:
        raise ValueError(f"{path}: holds holes of Labs {', '.join(labs)}; a file holds one lab's holes")
    parts.append("".join(kept))
    return parts


def render(parts: list[str | Hole], solved: frozenset[str] = frozenset()) -> str:
    """The labs/ file: each hole raises, except the holes of the labs in ``solved``, which hold the reference
    code (what a learner who solved them would have: the graders' own tests build such files)."""
    return "".join((p.body if p.lab in solved else p.raise_line) if isinstance(p, Hole) else p for p in parts)


def strip_solutions(text: str, path: str) -> str:
    """The labs/ version of one solutions/ file: every marked block replaced by its ``raise``."""
    return render(split_solutions(text, path))


def filled_holes(parts: list[str | Hole], actual: str) -> list[Hole] | None:
    """The holes a learner has filled in, if ``actual`` equals the generated file outside its holes.

    ``None`` means stale: something outside the holes differs, or a hole still raises with an old nudge.
    """
    holes = [p for p in parts if isinstance(p, Hole)]
    pattern = "(.*?)".join(re.escape(p) for p in parts if isinstance(p, str))
    match = re.fullmatch(pattern, actual, flags=re.DOTALL)
    if not match:
        return None
    filled = []
    for hole, body in zip(holes, match.groups()):
        if body == hole.raise_line:
            continue
        if body.strip().startswith("raise NotImplementedError("):
            return None  # an untouched hole with an out-of-date nudge
        filled.append(hole)
    return filled


INIT_HEADER = """# Generated by tools/make_labs.py. Modules with no lab here are found in solutions/{path}.
from pathlib import Path as _Path

__path__.append(str(_Path(__file__).resolve().parents[{depth}] / "solutions"{parts}))
"""
LAB_ALONE_HOOK = """
import os as _os

# The lab each module of labs/ holds. With {env}=N in the environment (`make grade LAB=N`, a
# notebook's IMPL switch), only Lab N's modules come from labs/; the others resolve to their solutions/ twins.
LAB_OF_MODULE = {{
{table}}}
LAB_ALONE = _os.environ.get("{env}") or None
if LAB_ALONE:
    # solutions/course.py, without importing solutions' engine
    from .course import take_other_labs_from_solutions

    take_other_labs_from_solutions(__name__, _Path(__path__[-1]), LAB_OF_MODULE, LAB_ALONE)
"""


def file_parts(text: str, rel: Path) -> list[str | Hole]:
    """The parts of the labs/ file made from solutions file ``rel`` (``text``),
    its generated header included."""
    parts = split_solutions(text, f"solutions/{rel}")
    return [HEADER.format(path=rel) + parts[0], *parts[1:]]


def lab_parts() -> dict[Path, list[str | Hole]]:
    """Every labs/ file as parts (the ``__init__.py`` files are a single kept text)."""
    files: dict[Path, list[str | Hole]] = {}
    packages = set()
    lab_of_module = {}
    for source in sorted(SOURCE.rglob("*.py")):
        rel = source.relative_to(SOURCE)
        parts = file_parts(source.read_text(), rel)
        if len(parts) > 1:
            files[TARGET / rel] = parts
            packages.update(rel.parents)
            lab_of_module[".".join(rel.with_suffix("").parts)] = parts[1].lab
    for package in packages:  # each a folder relative to solutions/, "." included
        rel = package / "__init__.py"
        dotted = "".join(f" / {part!r}" for part in package.parts).replace("'", '"')
        shown = "".join(f"{part}/" for part in package.parts)
        init = INIT_HEADER.format(path=shown, depth=len(package.parts) + 1, parts=dotted)
        if not package.parts:
            table = "".join(f'    "{module}": "{lab}",\n' for module, lab in sorted(lab_of_module.items()))
            init += LAB_ALONE_HOOK.format(env=LAB_ALONE_ENV, table=table)
        solution_init = (SOURCE / rel).read_text() if (SOURCE / rel).exists() else ""
        files[TARGET / rel] = [init + ("\n" + solution_init if solution_init.strip() else "")]
    return files


def lab_files() -> dict[Path, str]:
    return {path: render(parts) for path, parts in lab_parts().items()}


def all_holes() -> list[Hole]:
    return [p for parts in lab_parts().values() for p in parts if isinstance(p, Hole)]


@dataclass
class LabsState:
    """How labs/ on disk compares with what this script writes."""

    stale: list[Path]  # missing, or differing outside the holes: regenerate
    filled: dict[Path, list[Hole]]  # differing only inside holes: the learner's work
    extra: list[Path]  # files this script would not write


def labs_state() -> LabsState:
    wanted = lab_parts()
    present = set(TARGET.rglob("*.py")) if TARGET.exists() else set()
    state = LabsState([], {}, sorted(present - wanted.keys()))
    for path, parts in sorted(wanted.items()):
        actual = path.read_text() if path.exists() else None
        if actual == render(parts):
            continue
        filled = filled_holes(parts, actual) if actual is not None else None
        if filled is None:
            state.stale.append(path)
        else:
            state.filled[path] = filled
    return state


def describe_filled(filled: dict[Path, list[Hole]]) -> str:
    labs = sorted({h.lab for holes in filled.values() for h in holes})
    names = ", ".join(f"{h.function} (Lab {h.lab})" for holes in filled.values() for h in holes)
    return f"labs/ holds your own code in: {names}. Grade it with " + " / ".join(
        f"`make grade LAB={n}`" for n in labs
    )


def print_hints(lab: str, tier: int) -> int:
    """Each hole of ``lab``: its nudge, then its hints up to ``tier`` (tier 1 the idea and the trap, tier 2
    the shape of the code, tier 3 the tricky line), each wrapped to the terminal's usual width."""
    holes = [h for h in all_holes() if h.lab == lab]
    if not holes:
        print(f"no lab {lab}: the labs are {', '.join(sorted({h.lab for h in all_holes()}))}")
        return 1
    deepest = max(len(h.hints) for h in holes)
    wrap = lambda label, text: textwrap.fill(
        text, 110, initial_indent=label, subsequent_indent=" " * len(label), break_on_hyphens=False
    )
    for hole in holes:
        print(f"Lab {lab} · {hole.function}  (labs/{hole.path.removeprefix('solutions/')})")
        print(wrap("  nudge:  ", LAB_NUMBER.sub("", hole.nudge).strip()))
        for n, hint in enumerate(hole.hints[:tier], 1):
            print(wrap(f"  hint {n}: ", hint))
        print()
    if tier < deepest:
        print(f"more: `make hint LAB={lab} TIER={tier + 1}` ({deepest} tiers in all)")
    else:
        print(f"that is every hint of Lab {lab} ({deepest} tier{'s' * (deepest != 1)})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if labs/ is out of date; write nothing")
    parser.add_argument(
        "--allow-filled", action="store_true", help="with --check: accept holes the learner filled in"
    )
    parser.add_argument(
        "--force", action="store_true", help="overwrite labs/ files even where holes are filled in"
    )
    parser.add_argument("--hints", metavar="LAB", help="print the opt-in hints of one lab instead of writing")
    parser.add_argument(
        "--tier", type=int, default=1, help="with --hints: how many tiers to show (default 1)"
    )
    args = parser.parse_args()
    if args.hints is not None:
        return print_hints(args.hints, args.tier)
    state = labs_state()
    if args.check:
        for path in state.stale + state.extra:
            print(f"out of date: {path.relative_to(ROOT)}")
        if state.filled and not args.allow_filled:
            print(describe_filled(state.filled))
            print(
                "`make test` checks that labs/ holds exactly the generated holes (what the repository "
                "ships); as a learner, run `make check`, which accepts your filled-in holes."
            )
            return 1
        if state.stale or state.extra:
            print("labs/ is out of sync with solutions/: run `make labs` and commit the result")
            return 1
        note = f"; {sum(map(len, state.filled.values()))} hole(s) filled in by you" if state.filled else ""
        print(f"labs/ is in sync with solutions/ ({len(lab_parts())} files{note})")
        return 0
    keep = {} if args.force else state.filled
    wanted = lab_files()
    written = state.stale + [p for p in state.filled if p not in keep]
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[path])
    for path in state.extra:
        path.unlink()
    print(f"wrote {len(written)} file(s), removed {len(state.extra)} under labs/")
    if keep:
        print(
            f"kept {len(keep)} file(s) with your filled-in holes ({describe_filled(keep)}); "
            "--force overwrites them"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
