"""A small multiple-choice evaluation written for the course: its items (``items.py``) and their scoring by
log-likelihood through a model (``scoring.py``); ``python -m solutions eval`` runs it per precision."""
