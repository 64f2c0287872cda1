"""Builds the configured pipeline and runs groups through its three stages.

``build_pipeline`` turns ``stream.pipeline`` (or the default ``staleness → grpo → zero_variance``)
into operator objects, each looked up by its YAML name in the registry. A runtime then calls, per
poll of its input:

1. ``process(group, version)`` for every completed group: the group operators in order; the first
   drop reason ends it (the runtime counts the drop by kind);
2. ``emit(accepted)`` once: every accepted group plus what the mixers add (replayed copies,
   offline groups), in the ordering's order, each stamped with the names of the mixers and the
   ordering it passed. Before that, the runtime lets each ``offline`` mixer's source read what
   the accepted groups will earn it (``streams.offline``).
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.config import StreamConfig
from astraflow.config.pipeline import StalenessSpec
from astraflow.streams.operators import advantage, filters, mixing, ordering
from astraflow.streams.operators.base import (
    OPERATORS,
    Group,
    GroupOperator,
    Mixer,
    Ordering,
    StatefulOperator,
    run_pipeline,
)
from astraflow.streams.operators.mixing import OfflineMixer

OPERATOR_MODULES = (filters, advantage, mixing, ordering)
"""Importing these modules fills ``OPERATORS``: each class there is ``@register``-ed under its YAML name."""


@dataclass
class Pipeline:
    operators: list[GroupOperator]
    mixers: list[Mixer]
    ordering: Ordering | None  # None: the order in which groups completed
    max_staleness: int  # the staleness filter's bound: a sample's deadline is its version + this

    def process(self, group: Group, trainer_version: int) -> str | None:
        """Run the group operators; ``None`` when the group is accepted, else why it was dropped."""
        return run_pipeline(self.operators, group, trainer_version)

    def stateful(self) -> list[tuple[int, StatefulOperator]]:
        """The stateful operators, with their index among all the operators (group operators, then
        mixers, then the ordering): what a runtime saves with its commits and restores."""
        operators = [*self.operators, *self.mixers, *([self.ordering] if self.ordering else [])]
        return [(index, operator) for index, operator in enumerate(operators) if isinstance(operator, StatefulOperator)]

    @property
    def offline(self) -> list[OfflineMixer]:
        """The offline mixers, whose topics the runtime reads (``streams.offline.OfflineSource``)."""
        return [mixer for mixer in self.mixers if isinstance(mixer, OfflineMixer)]

    def emit(self, accepted: list[Group]) -> list[Group]:
        """The groups to send for ``accepted`` (in completion order): mixed in, ordered, stamped."""
        ready: list[Group] = []
        for group in accepted:
            ready.append(group)
            for mixer in self.mixers:
                ready.extend(mixer.mix(group))
        stamps = [mixer.name for mixer in self.mixers] + ([self.ordering.name] if self.ordering else [])
        for group in ready:
            group.operators.extend(stamps)
        return self.ordering.order(ready) if self.ordering else ready


def build_pipeline(config: StreamConfig) -> Pipeline:
    """The operators named by the stream config (``stream.pipeline`` or the default one)."""
    pipeline = Pipeline([], [], None, config.max_staleness)
    for spec in config.operators():
        params = spec.model_dump(exclude={"op"})
        if isinstance(spec, StalenessSpec):
            params["max_staleness"] = pipeline.max_staleness = (
                config.max_staleness if spec.max_staleness is None else spec.max_staleness
            )
        operator = OPERATORS[spec.op](**params)
        if spec.stage == "group":
            pipeline.operators.append(operator)
        elif spec.stage == "mixer":
            pipeline.mixers.append(operator)
        else:
            pipeline.ordering = operator
    return pipeline
