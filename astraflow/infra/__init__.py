"""AstraFlow infra."""
