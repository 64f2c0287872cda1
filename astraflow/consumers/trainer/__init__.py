"""The trainer: reads ``{run}.samples.{policy}``, takes optimizer steps, and publishes each weight
version with its ledger entry in one transaction."""
