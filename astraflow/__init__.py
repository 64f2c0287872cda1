"""AstraFlow."""
