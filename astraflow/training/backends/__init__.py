"""Trainer backends: the optimizer side of a trainer (``base.TrainerBackend``), one module each.

``torch`` (AdamW in this process), ``deepspeed`` (ZeRO, imported only when chosen) and
``simulated`` (sleeps each step's modelled time, for capacity planning). ``astraflow.training.learner``
builds the one ``train.backend`` names.
"""
