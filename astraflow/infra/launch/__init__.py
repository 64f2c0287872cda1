"""``astraflow run`` and ``astraflow replay``: every component as a supervised process on one machine,
and the dashboard."""
