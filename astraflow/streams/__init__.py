"""Stream processors: the pipeline's operators (filters, advantages, mixers, orderings) and its runtimes.

The native runtime runs on either log backend; the faust runtime runs on Kafka.
"""
