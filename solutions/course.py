"""Which code runs: the reference (``solutions``) or the learner's (``labs``), one lab of it or all of them.

A notebook's first cell names its implementation and its lab, and takes every module it experiments on from
here, so that one switch moves all of them together::

    IMPL = "solutions"  # "labs": run this notebook on your Lab 2 code
    fm = implementation(IMPL, lab=2)
    kv_bench = fm.module("bench.kv")   # labs.bench.kv when IMPL is "labs": solutions' file, wired to labs/
    llm = fm.LLM(device="cpu")

``"labs"`` with a lab takes only that lab's files from ``labs/`` (the learner's code); every other module of
``labs/`` resolves to its solutions/ twin, still under the ``labs`` name, so the package stays one set of
classes (a ``SamplingParams`` made by ``labs.bench.kv`` is the one ``labs.LLM`` expects). ``make grade LAB=N``
grades a lab the same way, through ``FASTMODE_LAB_ALONE=N``: Lab 2's paged kernel imports Lab 1's online
softmax, which then comes from solutions/, so an unfinished Lab 1 never fails Lab 2. ``lab=None`` takes every
lab from ``labs/``, as ``from labs import LLM`` does in a fresh interpreter.

The choice is made once per process, when ``labs`` is first imported; asking for another one afterwards
raises (restart the notebook's kernel). The environment variable also reaches child processes (a server
started by a notebook, a grader run from a cell). A Triton kernel runs on a CPU only through the
interpreter: importing ``solutions`` (or ``labs``) chooses it on a machine without a GPU, before any kernel
module loads.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

LAB_ALONE_ENV = "FASTMODE_LAB_ALONE"
IMPLEMENTATIONS = ("solutions", "labs")


class SolutionsTwins(importlib.abc.MetaPathFinder):
    """Finds ``<package>.<module>`` in ``solutions_dir`` for each of ``modules``
    (dotted, relative to the package).

    Placed first on ``sys.meta_path``, it shadows those labs/ files: each loads its solutions/ twin under the
    labs name, so the twin's relative imports stay inside the labs package.
    """

    def __init__(self, package: str, solutions_dir: Path, modules: set[str]):
        self.package, self.solutions_dir, self.modules = package, solutions_dir, modules

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, module = fullname.partition(".")
        if package != self.package or module not in self.modules:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.solutions_dir.joinpath(*module.split(".")).with_suffix(".py")
        )


def take_other_labs_from_solutions(
    package: str, solutions_dir: Path, lab_of_module: dict[str, str], lab: str
) -> None:
    """Make every module of ``package`` that holds a lab other than ``lab`` load from ``solutions_dir``.

    Called by the generated ``labs/__init__.py`` when ``FASTMODE_LAB_ALONE`` names a lab; ``lab_of_module`` is
    its table of which lab each labs/ module holds.
    """
    labs = sorted(set(lab_of_module.values()))
    if lab not in labs:
        raise ValueError(f"{LAB_ALONE_ENV}={lab!r} names no lab: the labs are {', '.join(labs)}")
    others = {module for module, its_lab in lab_of_module.items() if its_lab != lab}
    # One finder per package:
    # importing the package again (after a test dropped it from sys.modules) replaces it.
    sys.meta_path[:] = [
        f for f in sys.meta_path if not (isinstance(f, SolutionsTwins) and f.package == package)
    ]
    sys.meta_path.insert(0, SolutionsTwins(package, solutions_dir, others))


@dataclass(frozen=True)
class Implementation:
    """The package a notebook runs (``name``) and, for ``labs``,
    the lab taken from labs/ (None: every lab)."""

    name: str
    lab: str | None

    def module(self, dotted: str) -> ModuleType:
        """``module("cache.block_allocator")``: that module of the package this notebook runs."""
        return importlib.import_module(f"{self.name}.{dotted}")

    @property
    def LLM(self) -> type:  # noqa: N802 (the class it returns)
        return self.module("llm").LLM

    @property
    def SamplingParams(self) -> type:  # noqa: N802
        return self.module("sampling_params").SamplingParams

    def __str__(self) -> str:
        if self.name == "solutions":
            return 'IMPL = "solutions": the reference code'
        if self.lab is None:
            return 'IMPL = "labs": every lab from labs/ (your code)'
        return f'IMPL = "labs": Lab {self.lab} from labs/ (your code), every other module from solutions/'


def implementation(impl: str, lab: int | str | None = None) -> Implementation:
    """The implementation a notebook runs: ``impl`` is ``"solutions"`` or ``"labs"``; ``lab`` the lesson's lab
    (with ``"labs"``: only its files are the learner's; None: all of labs/)."""
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"IMPL must be one of {IMPLEMENTATIONS}, got {impl!r}")
    lab = None if lab is None else str(lab)
    if impl == "labs":
        loaded = sys.modules.get("labs")
        if loaded is None:
            if lab is None:
                os.environ.pop(LAB_ALONE_ENV, None)
            else:
                os.environ[LAB_ALONE_ENV] = lab
            importlib.import_module("labs")
        elif loaded.LAB_ALONE != lab:
            held = "every lab" if loaded.LAB_ALONE is None else f"Lab {loaded.LAB_ALONE} alone"
            wanted = "every lab" if lab is None else f"Lab {lab} alone"
            raise RuntimeError(
                f"labs is already imported with {held} from labs/, not {wanted}: restart the kernel"
            )
    return Implementation(impl, lab)
