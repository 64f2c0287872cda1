"""The ``stream`` section: the stream processor's pipeline and the task feeder's curators."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from astraflow.config.base import Section
from astraflow.config.pipeline import (
    ADVANTAGE_SPECS,
    OperatorSpec,
    ReplaySpec,
    StalenessSpec,
    ZeroVarianceSpec,
    check_pipeline,
)


class AcceptAllCurator(Section):
    type: Literal["accept_all"] = "accept_all"
    """Submit every prompt."""


class FilterSolvedCurator(Section):
    type: Literal["filter_solved"] = "filter_solved"
    """Stop submitting prompts whose EWMA pass rate exceeds a threshold."""
    threshold: float = Field(default=0.95, gt=0.0, le=1.0)
    """Stop submitting a prompt once the EWMA of its pass rate exceeds this."""
    alpha: float = Field(default=0.5, gt=0.0, le=1.0)
    """EWMA weight of a prompt's newest group (1: only the last group counts)."""
    min_groups: int = Field(default=1, ge=1)
    """Groups of a prompt observed before it may be filtered."""


class GresoCurator(Section):
    type: Literal["greso"] = "greso"
    """GRESO: skip prompts after zero-variance streaks with probability 1 − p^streak."""
    p_easy: float = Field(default=0.5, gt=0.0, le=1.0)
    """Initial submit probability base after all-correct groups (submit with p_easy^streak)."""
    p_hard: float = Field(default=0.5, gt=0.0, le=1.0)
    """Initial submit probability base after all-wrong groups (submit with p_hard^streak)."""
    target_easy: float = Field(default=0.083, ge=0.0, le=1.0)
    """Target share of groups that are all correct; p_easy falls while the share is at or above it."""
    target_hard: float = Field(default=0.167, ge=0.0, le=1.0)
    """Target share of groups that are all wrong; p_hard falls while the share is at or above it."""
    step: float = Field(default=0.01, gt=0.0, le=0.5)
    """Change of p_easy / p_hard after each adaptation window."""
    p_min: float = Field(default=0.05, gt=0.0, le=1.0)
    """Lower bound of p_easy and p_hard."""
    p_max: float = Field(default=0.95, gt=0.0, le=1.0)
    """Upper bound of p_easy and p_hard."""
    adapt_every: int = Field(default=64, ge=1)
    """Groups of feedback per adaptation window (GRESO adapts once per training batch)."""
    seed: int = 0
    """Seed of the submit draws."""

    @model_validator(mode="after")
    def _bounds(self) -> "GresoCurator":
        if not self.p_min <= min(self.p_easy, self.p_hard) <= max(self.p_easy, self.p_hard) <= self.p_max:
            raise ValueError(f"need p_min ({self.p_min}) <= p_easy, p_hard <= p_max ({self.p_max})")
        return self


CuratorSpec = Annotated[Union[AcceptAllCurator, FilterSolvedCurator, GresoCurator], Field(discriminator="type")]


class StreamConfig(Section):
    """The stream processor's pipeline and the feeder's curator.

    ``pipeline`` lists the operators (``{op: name, ...params}``, see ``astraflow.config.pipeline``).
    Without it, ``advantage`` and ``drop_zero_variance`` give the default pipeline
    ``staleness → <advantage> → zero_variance``; with it, they must be left unset.
    """

    max_staleness: int = Field(default=2, ge=0)
    """Drop a sample when trainer version − its oldest token version exceeds this (also the feeder's budget)."""
    advantage: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"] = "grpo"
    """Advantage estimator of the default pipeline (when ``pipeline`` is unset)."""
    drop_zero_variance: bool = True
    """Default pipeline: drop groups whose rewards are all equal (they carry no gradient)."""
    pipeline: list[OperatorSpec] | None = None
    """Operators in dataflow order: group operators, then mixers, then at most one ordering."""
    spare_groups: float = Field(default=1.25, ge=0.0, le=10.0)
    (
        "Where ``max_staleness`` is 0: the feeder releases each batch with spares, this many times the groups a "
        "batch loses at the drop rate of the last four versions, so a batch is usually full without a round trip "
        "to replace its drops; spares no drop used are surplus and go stale. 0: replace drops once reported."
    )
    curator: CuratorSpec = AcceptAllCurator()
    """Which prompts the task feeder submits, from the PromptStats on the feedback topic."""
    max_abs_reward: float = Field(default=1e6, gt=0.0, le=1e30)
    """A trajectory whose reward's magnitude exceeds this is dead-lettered on entry to the stream (at most 1e30, so
    group statistics never overflow)."""
    group_timeout_s: float = Field(default=300.0, gt=0.0)
    (
        "A group still missing members this long after its first member's record (in record timestamps, not the "
        "processor's clock, so a restart after an outage expires nothing) is dead-lettered as incomplete."
    )
    verify_tasks: Literal["auto", "on", "off"] = "auto"
    (
        "Check each trajectory against the task it names on the tasks topic (``streams/runtimes/issued_tasks.py``): "
        "issued by the feeder, of the same prompt id, group and workflow, and - for the single-turn workflow - "
        "prompt ids that are the task's prompt as the engines encode it; a mismatch is dead-lettered. ``auto``: on "
        "where the log authenticates each role (Kafka with ``log.security.role_credentials``), the only place where "
        "a producer cannot write the task it names as well; ``on``: everywhere (a producer's bug); ``off``: never "
        "(a replay, whose trajectories are copied without their tasks)."
    )
    runtime: Literal["native", "faust"] | None = None
    (
        "What runs the pipeline: ``native`` (any log) or ``faust`` (Kafka only: faust agents, half-filled groups in a "
        "changelog-backed table, exactly-once through Kafka transactions); unset: faust on Kafka, native on the "
        "embedded log."
    )
    instances: int = Field(default=1, ge=1, le=64)
    (
        "Stream processor instances of each policy that ``astraflow run`` starts (native runtime): they share the "
        "trajectories partitions in one consumer group, each restoring the state of the partitions it is given, and "
        "one that stops has its partitions taken over by the others. At most ``log.partitions`` of them have work."
    )

    @model_validator(mode="after")
    def _pipeline_is_runnable(self) -> "StreamConfig":
        if self.pipeline is None:
            return self
        legacy = sorted({"advantage", "drop_zero_variance"} & self.model_fields_set)
        if legacy:
            raise ValueError(f"{', '.join(legacy)}: only for the default pipeline; write it into stream.pipeline")
        try:
            check_pipeline(self.pipeline)
        except ValueError as exc:
            raise ValueError(f"pipeline: {exc}") from exc
        return self

    @model_serializer(mode="wrap")
    def _omit_legacy(self, handler: SerializerFunctionWrapHandler) -> dict:
        """With a pipeline, the saved config leaves out the default pipeline's fields, so it loads again."""
        data = handler(self)
        if self.pipeline is not None:
            data.pop("advantage", None)
            data.pop("drop_zero_variance", None)
        return data

    def operators(self) -> list[OperatorSpec]:
        """The pipeline as written, or the default one built from the legacy fields."""
        if self.pipeline is not None:
            return list(self.pipeline)
        default: list[OperatorSpec] = [StalenessSpec(), ADVANTAGE_SPECS[self.advantage]()]
        return default + [ZeroVarianceSpec()] if self.drop_zero_variance else default

    @property
    def staleness_bound(self) -> int | None:
        """The staleness filter's bound (``stream.max_staleness`` unless its operator sets one); ``None``
        without a ``staleness`` operator (a replay of another run's versions)."""
        spec = next((spec for spec in self.operators() if isinstance(spec, StalenessSpec)), None)
        if spec is None:
            return None
        return self.max_staleness if spec.max_staleness is None else spec.max_staleness

    @property
    def replay_ratio(self) -> float:
        """Fraction of emitted samples that are replayed (0 without a ``replay`` operator)."""
        return next((spec.ratio for spec in self.operators() if isinstance(spec, ReplaySpec)), 0.0)

    def lockstep_replays(self, batch_groups: int, partitions: int) -> int | None:
        """Replayed groups a lockstep batch of ``batch_groups`` takes, the rest fresh (``None`` where the
        staleness bound is not 0 or nothing is replayed): ⌊ρ B⌋, less one for each stream partition
        after the first. Each partition's replay mixer holds back a fraction of a group of credit, so
        one version's fresh groups can earn up to that many replays fewer than ρ B; in lockstep a
        batch cannot wait for the next version's, so it asks for no more than it surely gets. The
        feeder releases the rest of the batch in fresh groups, and one more (``PolicyBudget``)."""
        ratio = self.replay_ratio
        if ratio <= 0 or self.staleness_bound != 0:
            return None
        return max(0, int(ratio * batch_groups + 1e-9) - (partitions - 1))
