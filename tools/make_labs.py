"""Write labs/ from solutions/: each marked block becomes the learner's exercise.

In solutions/, the learner's part of a function is marked::

    # BEGIN SOLUTION Lab 0: normalise by the root mean square in float32, then scale
    ...reference code...
    # END SOLUTION

and labs/ gets, at the same indentation, ``raise NotImplementedError("Lab 0: normalise ...")``.
Everything else is copied as is, so ``labs`` is a complete engine with holes. ``--check`` exits 1
if labs/ differs from what this script would write (CI runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE, TARGET = ROOT / "solutions", ROOT / "labs"
BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION\s*(?P<hint>.*)$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
HEADER = "# Generated from solutions/{path} by tools/make_labs.py: fill in each NotImplementedError.\n"


def strip_solutions(text: str, path: str) -> str:
    out, inside = [], False
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError(f"{path}:{number}: BEGIN SOLUTION inside another solution block")
            inside = True
            hint = begin["hint"] or "fill in this block"
            out.append(f"{begin['indent']}raise NotImplementedError({hint!r})\n")
        elif END.match(line):
            if not inside:
                raise ValueError(f"{path}:{number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{path}: BEGIN SOLUTION is never closed")
    return "".join(out)


def lab_files() -> dict[Path, str]:
    files = {}
    for source in sorted(SOURCE.rglob("*.py")):
        rel = source.relative_to(SOURCE)
        text = source.read_text()
        body = strip_solutions(text, f"solutions/{rel}")
        files[TARGET / rel] = (HEADER.format(path=rel) + body) if body != text else text
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if labs/ is out of date; write nothing")
    args = parser.parse_args()
    wanted = lab_files()
    present = {p for p in TARGET.rglob("*.py")} if TARGET.exists() else set()
    stale = sorted(p for p, text in wanted.items() if not p.exists() or p.read_text() != text)
    extra = sorted(present - wanted.keys())
    if args.check:
        for path in stale + extra:
            print(f"out of date: {path.relative_to(ROOT)}")
        if stale or extra:
            print("labs/ is out of sync with solutions/: run `make labs` and commit the result")
            return 1
        print(f"labs/ is in sync with solutions/ ({len(wanted)} files)")
        return 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[path])
    for path in extra:
        path.unlink()
    print(f"wrote {len(stale)} file(s), removed {len(extra)} under labs/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
