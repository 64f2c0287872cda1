"""AstraFlow schemas."""
