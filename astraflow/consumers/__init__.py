"""Consumers of a policy's samples and weights: the trainer (``trainer/``: samples → weight versions)
and the evaluators (``evaluators/``), two components that never import each other."""
