"""Fault injection for tests and benchmarks: killing components, remote regions in network namespaces, slow links.

Nothing in the runtime imports this package (an import-linter contract); tests and benchmarks do."""
