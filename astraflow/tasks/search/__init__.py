"""The search task: made-up facts only a search can answer, the BM25 index over them, and the environment."""
