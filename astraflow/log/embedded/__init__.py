"""The embedded log: topics, transactions and consumer groups in one SQLite file (one machine)."""
