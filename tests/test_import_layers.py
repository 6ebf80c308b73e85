"""Imports run one way through ``solutions``: each package imports only from packages of a lower layer.

``LAYERS`` below is the one statement of the direction, bottom first. A module may import from its own package
and from any package of a lower layer: never upward, never sideways into another package of its own layer
(give one of the two a lower layer instead), so packages cannot form a cycle. Within a package, the modules'
top-level imports must not form a cycle either. The test reads every module's source (its AST: imports inside
functions and under ``TYPE_CHECKING`` included) and names the module, the import and the rule it breaks.

Imports of ``solutions`` modules stand at the top of a module, relative (so that ``labs/``, which reuses these
files, stays inside its own package). An import inside a function is for another library only: an optional
peer (``llama_cpp``) or one that takes seconds to load (``transformers``). Triton kernel modules need no late
import: the package's ``__init__`` chooses ``TRITON_INTERPRET`` before any of them loads. ``__main__`` finds a
command's module under ``cli/`` by name (``importlib``), which no import statement shows.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "solutions"

# Bottom first: (what the layer holds, its top-level packages and modules of solutions/).
LAYERS: list[tuple[str, set[str]]] = [
    ("leaves: values and paths, no import from solutions", {"paths", "sampling_params", "course"}),
    (
        "kernels: tensors in, tensors out (Triton, torch, the CPU paths and their measured choice)",
        {"kernels"},
    ),
    ("the engine's options, validated", {"config"}),
    ("the model: Llama and its layers, loading, tokenizer", {"model"}),
    ("the lessons' parts beside the model", {"cache", "quant", "speculative", "moe"}),
    ("tensor parallelism's layers and shards (they quantize a shard as quant/ does)", {"parallel"}),
    ("the engine: scheduler, runner, speculator, tensor-parallel executor", {"engine"}),
    ("the public API and its command-line flags", {"llm", "engine_options"}),
    ("measuring helpers, the server and the evaluation, on the public API", {"bench", "serve", "eval"}),
    ("Lesson 7's planner and measurements, on the measuring helpers", {"fast_mode"}),
    ("commands: python -m solutions and its drivers", {"cli", "__main__"}),
    ("the package's public names", {"__init__"}),
]
RANK = {name: rank for rank, (_, names) in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_name(module: str) -> str:
    """The layer entry of a module: its top-level package, or the root module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> list[tuple[str, int, bool, str]]:
    """``(target module, line, inside a function, source text)`` for each import of a solutions module."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    in_function: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function.update(ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names if alias.name.split(".")[0] == "solutions"]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            stem = ".".join(base + ([node.module] if node.module else []))
            targets = [f"{stem}.{alias.name}" for alias in node.names] if node.module is None else [stem]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "solutions":
            targets = [node.module]
        else:
            continue
        text = ast.get_source_segment(path.read_text(), node) or ""
        found += [(target, node.lineno, node in in_function, text) for target in targets]
    return found


def solutions_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_package_has_a_layer():
    unplaced = sorted({top_name(module_name(p)) for p in solutions_modules()} - RANK.keys())
    assert not unplaced, (
        f"{unplaced} are in no layer of tests/test_import_layers.py's LAYERS: give each the lowest layer "
        "whose packages it may import from"
    )


def test_imports_run_down_the_layers():
    problems = []
    for path in solutions_modules():
        source, rel = module_name(path), path.relative_to(PACKAGE.parent)
        for target, line, inside_function, text in imported_modules(path):
            where = f"{rel}:{line} `{text}`"
            if not text.startswith("from ."):
                problems.append(f"{where}: import solutions modules relatively (labs/ reuses this file)")
                continue
            if inside_function:
                problems.append(
                    f"{where}: imports of solutions modules go at the top of the module (a function-level "
                    "import hides a dependency; only another library's optional or slow import may wait)"
                )
            mine, theirs = top_name(source), top_name(target)
            if mine == theirs or theirs not in RANK or mine not in RANK:
                continue
            if RANK[theirs] > RANK[mine]:
                problems.append(
                    f"{where}: {mine} (layer {RANK[mine]}: {LAYERS[RANK[mine]][0]}) imports upward from "
                    f"{theirs} (layer {RANK[theirs]}: {LAYERS[RANK[theirs]][0]})"
                )
            elif RANK[theirs] == RANK[mine]:
                problems.append(
                    f"{where}: {mine} imports sideways from {theirs}, in its own layer "
                    f"({LAYERS[RANK[mine]][0]}): one of them belongs in a lower layer"
                )
    assert not problems, "imports against the layers:\n" + "\n".join(problems)


def test_no_import_cycle_between_modules():
    """Top-level imports only: a cycle among them fails or half-initialises a module depending on which one
    is imported first."""
    graph: dict[str, set[str]] = defaultdict(set)
    modules = {module_name(p): p for p in solutions_modules()}
    for name, path in modules.items():
        for target, _, inside_function, _ in imported_modules(path):
            if not inside_function and target in modules and target != name:
                graph[name].add(target)
    cycles = strongly_connected(graph)
    assert not cycles, "modules that import each other (a cycle of top-level imports):\n" + "\n".join(
        " -> ".join(sorted(cycle)) for cycle in cycles
    )


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of more than one node: each is a cycle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize(
    "source, rule",
    [
        pytest.param("from ..engine.runner import ModelRunner\n", "imports upward", id="upward"),
        pytest.param("from ..quant.model import quantize_model\n", "sideways", id="sideways"),
        pytest.param(
            "def f():\n    from ..model.llama import LlamaModel\n", "top of the module", id="in-function"
        ),
        pytest.param("from solutions.model.llama import LlamaModel\n", "relatively", id="absolute"),
    ],
)
def test_a_planted_import_is_named(tmp_path, monkeypatch, source, rule):
    """The check itself: a module of speculative/ (layer 4) given each kind of bad import fails, naming it."""
    fake = tmp_path / "solutions"
    (fake / "speculative").mkdir(parents=True)
    (fake / "speculative" / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    with pytest.raises(AssertionError, match=rule) as failure:
        test_imports_run_down_the_layers()
    assert "speculative/bad.py:" in str(failure.value), f"the failure must name the module:\n{failure.value}"
