"""Consumers of a policy's samples and weights: the trainer (samples → weight versions) and the evaluators."""
