"""The command layer: what ``python -m solutions COMMAND`` runs. Each module parses its options, drives the
library (a benchmark's measuring helpers, a calibration, a training run) and prints or writes the result; none
is imported by the library. ``bench/NAME.py`` is ``python -m solutions bench NAME``."""
