"""No notebook names a path outside the repository: a learner's clone holds only the repository, so a reading
list or a data file that points past it (``../shared/...``, an absolute path of the machine that wrote the
notebook) is a dead link there. Every relative path a notebook's cells name from ``notebooks/`` must exist in
the repository, and they name no absolute path; the root's documents are held to the same rule from the root.
(Stored outputs are not checked: a library's warning names where that library is installed.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
RELATIVE = re.compile(r"(?<![\w./])((?:\.\./)+[\w][\w./-]*)")
ABSOLUTE = re.compile(r"(?<![\w.~])/(?:work|home|tmp|mnt|root|Users)/[\w./-]+")


def named_paths(text: str, folder: Path) -> list[str]:
    """The relative paths in ``text`` that leave the repository or do not exist in it; its absolute paths."""
    bad = []
    for path in RELATIVE.findall(text):
        target = (folder / path.rstrip(".")).resolve()
        if not target.is_relative_to(ROOT) or not target.exists():
            bad.append(path)
    return bad + ABSOLUTE.findall(text)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_a_notebook_names_no_path_outside_the_repository(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    found = {}
    for index, cell in enumerate(cells):
        if bad := named_paths("".join(cell["source"]), notebook.parent):
            found[index] = bad
    assert not found, (
        f"{notebook.name} names paths outside the repository (cell: paths): {found}. A learner's clone has "
        "only the repository: point inside it (the sources the notebooks cite are in SOURCES.md at the root)"
    )


@pytest.mark.parametrize("document", ["README.md", "CONTRIBUTING.md", "SOURCES.md"])
def test_the_root_documents_name_no_path_outside_the_repository(document):
    bad = named_paths((ROOT / document).read_text(), ROOT)
    assert not bad, f"{document} names paths outside the repository: {bad}"


def test_the_check_finds_a_path_outside_the_repository():
    assert named_paths("see `../shared/SOURCES.md`", ROOT / "notebooks") == ["../shared/SOURCES.md"]
    assert named_paths("log at /work/main/run.txt", ROOT / "notebooks") == ["/work/main/run.txt"]
    assert named_paths("[SOURCES.md](../SOURCES.md), ../data/spec/heldout.jsonl.", ROOT / "notebooks") == []
