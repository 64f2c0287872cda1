"""Held-out scores of a policy: greedy exact match, and an answering policy checked by a judging policy."""
