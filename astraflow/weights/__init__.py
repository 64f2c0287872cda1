"""Weight versions on the log: the trainer publishes them, producers and the evaluator follow them."""
