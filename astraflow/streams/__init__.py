"""Stream processors: the pipeline's operators (``operators/``: filters, advantages, mixers,
orderings) and its runtimes (``runtimes/``: native on either log backend, faust on Kafka)."""
