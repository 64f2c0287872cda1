"""The base checkpoint a run starts from: a supervised warm-up of a fresh model, built once and cached."""
