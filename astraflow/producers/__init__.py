"""Producers: the task feeder with its curators (``feeder/``) and the rollout producer (``rollout/``),
two components that never import each other; the workflows both read are in ``astraflow.episodes``."""
