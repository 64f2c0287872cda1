"""``python -m astraflow.cli``: how ``astraflow run`` starts each component process."""

from astraflow.cli import main

main()
