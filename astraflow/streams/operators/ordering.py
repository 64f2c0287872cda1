"""Orderings of the groups that are ready to be emitted together (one poll of the runtime).

- FIFO: in the order the groups completed.
- EDF (earliest deadline first): a sample's deadline is ``version + max_staleness``, the last
  trainer version that may still train on it. Every group shares ``max_staleness``, so EDF is a
  stable sort by the group's oldest token version. The AstraFlow authors found FIFO biases
  training toward short, easy samples, which complete first (docs/algorithms.md).

The trainer assembles batches in offset order, so the order chosen here is the training order.
"""

from __future__ import annotations

from astraflow.streams.operators.base import Group, register


@register
class FifoOrdering:
    name = "fifo"

    def order(self, groups: list[Group]) -> list[Group]:
        return list(groups)


@register
class EdfOrdering:
    name = "edf"

    def order(self, groups: list[Group]) -> list[Group]:
        return sorted(groups, key=lambda group: group.min_version)
