"""warcore."""
