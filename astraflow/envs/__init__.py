"""Environments of multi-turn workflows: the contract, tool-call parsing, and the HTTP adapter with
its bounded client and server. The bundled environments live with their tasks (``tasks/<domain>/``),
the catalog that builds them from a config in ``tasks.catalog``, and the loop that plays them
token-exactly in ``episodes.loop``."""
