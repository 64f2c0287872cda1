"""The vocabulary every layer shares: the exception tree, the run directory's paths, the metric names.

Nothing here imports another AstraFlow package: it is the bottom layer."""
