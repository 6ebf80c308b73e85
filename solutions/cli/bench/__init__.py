"""One module per ``python -m solutions bench NAME``: its options and its report. What it measures with lives
in ``solutions/bench/``, where the notebooks and tests import it too."""
