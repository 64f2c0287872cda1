"""Producers: the task feeder with its curators, the rollout producer, and the workflows it runs."""
