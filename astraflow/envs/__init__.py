"""Environments of multi-turn workflows: the contract, the bundled ones, the HTTP adapter, the
catalog that builds them from the config, and the episode loop that plays them token-exactly."""
