"""AstraFlow producers."""
