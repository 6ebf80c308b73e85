"""Serving: an OpenAI-compatible HTTP server on the engine (``python -m solutions serve``)."""
