"""The base checkpoint a run starts from: the tiny model (``tiny.py``), its supervised warm-up
(``sft.py``), built once and cached (``cache.py``). Run by ``astraflow warmup`` and ``astraflow run``
before the components start."""
