"""Write AWQ's calibration mix and its unseen evaluation texts into data/text/
(provenance: data/text/README.md).

Calibration (``awq_calibration_mix.txt``), three genres interleaved by paragraph blocks:
  - SmolLM2-135M-Instruct's own greedy chat replies (this engine, float32) to ``CHAT_PROMPTS``;
  - docstrings of CPython 3.11 standard-library modules in ``DOCSTRING_MODULES`` (modern technical prose);
  - source code of the standard-library modules in ``CODE_MODULES``.
General text (``awq_general_mix.txt``): the course's own prose, the markdown cells of the notebooks and
``CONTRIBUTING.md``, interleaved in blocks of about ``GENERAL_BLOCK`` characters (no model run needed).
Evaluation, none of it used in either calibration text:
  - ``eval_python_reference.txt``: sections of the Python language reference (``pydoc_data.topics``, the first
    5000 characters of each);
  - ``eval_python_code.txt``: source of ``fractions.py`` and ``statistics.py``
    (the first 20000 characters of each);
  - ``kjv_luke_1-12.txt`` (already shipped).

Run: ``PYTHONPATH=$PWD python tools/make_awq_texts.py`` (``--general-only``: the general text alone).
Deterministic for a given Python, model and commit.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = ROOT / "data" / "text"
STDLIB = Path(sysconfig.get_paths()["stdlib"])

CHAT_PROMPTS = [
    "How do I make a simple tomato soup?",
    "Explain how vaccines train the immune system.",
    "Write a short poem about autumn rain.",
    "What caused the fall of the Roman Empire?",
    "Give me three tips for a job interview.",
    "How does a bicycle stay upright when it moves?",
    "Write a Python function that reverses a linked list.",
    "What is the difference between weather and climate?",
    "Plan a one-day trip to Kyoto for a first-time visitor.",
    "Explain compound interest with an example.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "How do I keep a sourdough starter alive?",
    "What are black holes made of?",
    "Write a polite email asking my landlord to fix the heating.",
    "Explain recursion to a ten-year-old.",
    "What are the health benefits of walking every day?",
    "How does a refrigerator keep food cold?",
    "Describe the water cycle.",
    "What is a good way to learn a new language as an adult?",
    "Write a SQL query that counts orders per customer.",
    "Why do cats purr?",
    "Explain what inflation is and why it happens.",
    "Tell me a short story about a robot who learns to paint.",
    "How do solar panels turn sunlight into electricity?",
    "What should I pack for a week of hiking?",
    "Explain the difference between a list and a tuple in Python.",
    "Who was Marie Curie and what did she discover?",
    "How can I improve my sleep?",
    "What is photosynthesis, in simple terms?",
    "Give me a recipe for pancakes without eggs.",
    "Explain how the internet routes a message from one computer to another.",
]
DOCSTRING_MODULES = [
    "argparse",
    "asyncio",
    "collections",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "functools",
    "itertools",
    "logging",
    "pathlib",
    "re",
    "subprocess",
    "threading",
    "typing",
    "unittest",
]
CODE_MODULES = ["textwrap.py", "bisect.py", "shlex.py", "queue.py"]
EVAL_REFERENCE_TOPICS = [
    "assignment",
    "class",
    "compound",
    "exceptions",
    "function",
    "import",
    "naming",
    "types",
]
EVAL_CODE_MODULES = ["fractions.py", "statistics.py"]
CHAT_TOKENS = 160
GENERAL_BLOCK = 3000


def chat_replies() -> list[str]:
    from solutions import LLM, SamplingParams

    llm = LLM(device="cpu", dtype="float32", max_num_seqs=len(CHAT_PROMPTS), max_model_len=512)
    outs = llm.chat(
        [[{"role": "user", "content": p}] for p in CHAT_PROMPTS],
        SamplingParams(temperature=0, max_tokens=CHAT_TOKENS),
    )
    return [f"Q: {p}\nA: {o.outputs[0].text.strip()}" for p, o in zip(CHAT_PROMPTS, outs)]


def docstrings() -> list[str]:
    blocks = []
    for name in DOCSTRING_MODULES:
        module = importlib.import_module(name)
        parts = [inspect.getdoc(module) or ""]
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj)):
                if getattr(obj, "__module__", "") == name and inspect.getdoc(obj):
                    parts.append(f"{attr}: {inspect.getdoc(obj)}")
        blocks.append("\n\n".join(p for p in parts if p)[:6000])
    return blocks


def code(files: list[str], limit: int = 12000) -> list[str]:
    return [(STDLIB / f).read_text()[:limit] for f in files]


def course_prose() -> list[list[str]]:
    """Per source (each notebook's markdown cells, then ``CONTRIBUTING.md``), its text in blocks of whole
    paragraphs of about ``GENERAL_BLOCK`` characters."""
    sources = [
        "\n\n".join(
            "".join(c["source"])
            for c in json.loads(path.read_text())["cells"]
            if c["cell_type"] == "markdown"
        )
        for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
    ]
    sources.append((ROOT / "CONTRIBUTING.md").read_text())
    blocked = []
    for text in sources:
        blocks, current = [], ""
        for paragraph in text.split("\n\n"):
            current = f"{current}\n\n{paragraph}" if current else paragraph
            if len(current) >= GENERAL_BLOCK:
                blocks.append(current)
                current = ""
        blocked.append(blocks + [current] if current else blocks)
    return blocked


def interleave(*groups: list[str]) -> str:
    out, longest = [], max(len(g) for g in groups)
    for i in range(longest):
        for group in groups:
            if i < len(group):
                out.append(group[i])
    return "\n\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--general-only", action="store_true", help="write awq_general_mix.txt alone")
    args = parser.parse_args()
    (TEXT / "awq_general_mix.txt").write_text(interleave(*course_prose()))
    print("awq_general_mix.txt", len((TEXT / "awq_general_mix.txt").read_text()), "chars")
    if args.general_only:
        return
    from pydoc_data.topics import topics

    calibration = interleave(chat_replies(), docstrings(), code(CODE_MODULES))
    (TEXT / "awq_calibration_mix.txt").write_text(calibration)
    (TEXT / "eval_python_reference.txt").write_text(
        "\n\n".join(topics[t][:5000] for t in EVAL_REFERENCE_TOPICS)
    )
    (TEXT / "eval_python_code.txt").write_text("\n\n".join(code(EVAL_CODE_MODULES, limit=20000)))
    for f in ("awq_calibration_mix.txt", "eval_python_reference.txt", "eval_python_code.txt"):
        print(f, len((TEXT / f).read_text()), "chars")


if __name__ == "__main__":
    main()
