"""AstraFlow consumers."""
