"""AstraFlow streams."""
