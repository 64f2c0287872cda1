"""Analysis consumers: read-only views of a run (tail, stats, report, export, audit, runs), attached at any time."""
