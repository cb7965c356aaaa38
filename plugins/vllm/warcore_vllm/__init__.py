"""warcore inside vLLM 0.33.0 (placeholder, filled in below)."""

__version__ = "0.1.0"
