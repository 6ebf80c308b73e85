"""One module per ``python -m solutions bench NAME``: its options and its report. What it measures with lives
in ``solutions/bench/``, where the notebooks and tests import it too."""

from __future__ import annotations

import argparse


def bench_parser(module: str, description: str) -> argparse.ArgumentParser:
    """The options of the benchmark in ``module`` (its ``__name__``): ``python -m solutions bench NAME``."""
    return argparse.ArgumentParser(
        prog=f"python -m solutions bench {module.rsplit('.', 1)[-1]}", description=description
    )
