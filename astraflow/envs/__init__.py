"""Environments of multi-turn workflows: the contract, bundled ones, and the HTTP adapter."""
