"""The YAML specs of stream operators: ``stream.pipeline`` is a list of ``{op: <name>, ...params}``.

Each spec is a pydantic model with a docstring and bounds per field; ``OperatorSpec`` is the union
discriminated on ``op``, so an unknown operator or an unknown parameter fails when the config is
loaded, and the error names ``stream.pipeline.<index>.<op>.<field>``. This module holds only
configuration (it is imported by ``astraflow.config``); the operator classes that a spec builds
live next to it (``filters``, ``advantage``, ``mixing``, ``ordering``), registered under the same
name.

``stage`` says where in the dataflow an operator acts: ``group`` operators see one complete group
and may annotate or drop it (in the order written); a ``mixer`` adds groups to emit after a group
is accepted; an ``ordering`` orders the groups ready to be emitted.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

Stage = Literal["group", "mixer", "ordering"]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)
    stage: ClassVar[Stage] = "group"
    advantage: ClassVar[bool] = False


class StalenessSpec(_Spec):
    op: Literal["staleness"] = "staleness"
    """Filter: drop groups whose oldest token is too many versions behind the trainer."""
    max_staleness: int | None = Field(default=None, ge=0)
    """Drop a group when trainer version − its oldest token version exceeds this; unset: ``stream.max_staleness``."""


class ZeroVarianceSpec(_Spec):
    op: Literal["zero_variance"] = "zero_variance"
    """Filter (DAPO dynamic sampling): drop groups whose rewards are all equal."""
    atol: float = Field(default=1e-9, ge=0.0)
    """Rewards closer than this count as equal (dynamic sampling drops all-equal groups)."""


class ResponseLengthSpec(_Spec):
    op: Literal["response_length"] = "response_length"
    """Filter: drop groups with a response outside [min_tokens, max_tokens]."""
    min_tokens: int = Field(default=1, ge=0)
    """Drop the group when any response has fewer tokens than this."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Drop the group when any response has more tokens than this; unset: no upper bound."""

    @model_validator(mode="after")
    def _ordered(self) -> "ResponseLengthSpec":
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) is below min_tokens ({self.min_tokens})")
        return self


class RewardRangeSpec(_Spec):
    op: Literal["reward_range"] = "reward_range"
    """Filter: drop groups whose mean reward (or any reward) is outside [low, high]."""
    low: float | None = None
    """Lowest allowed value of the checked reward; unset: no lower bound."""
    high: float | None = None
    """Highest allowed value of the checked reward; unset: no upper bound."""
    on: Literal["mean", "each"] = "mean"
    """``mean``: the group's mean reward (difficulty filtering); ``each``: every response's reward."""

    @model_validator(mode="after")
    def _ordered(self) -> "RewardRangeSpec":
        if self.low is None and self.high is None:
            raise ValueError("set low, high or both")
        if self.low is not None and self.high is not None and self.high < self.low:
            raise ValueError(f"high ({self.high}) is below low ({self.low})")
        return self


class DuplicateSpec(_Spec):
    op: Literal["duplicate"] = "duplicate"
    """Filter: drop groups holding a trajectory id that already passed."""
    remember: int = Field(default=100_000, ge=1, le=10_000_000)
    """How many recently passed trajectory ids are remembered (oldest forgotten first)."""


class GrpoSpec(_Spec):
    op: Literal["grpo"] = "grpo"
    """Advantage (GRPO): (r − mean) / (std + eps) within the group."""
    advantage: ClassVar[bool] = True
    eps: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Added to the group's standard deviation before dividing."""


class DrGrpoSpec(_Spec):
    op: Literal["dr_grpo"] = "dr_grpo"
    """Advantage (Dr.GRPO): r − mean within the group; pair with the trainer's seq-mean-token-sum-norm."""
    advantage: ClassVar[bool] = True


class RlooSpec(_Spec):
    op: Literal["rloo"] = "rloo"
    """Advantage (RLOO): r minus the mean of the group's other rewards."""
    advantage: ClassVar[bool] = True


class ReinforcePPSpec(_Spec):
    op: Literal["reinforce_pp"] = "reinforce_pp"
    """Advantage (REINFORCE++ baseline): r − group mean, whitened over a window of recent responses."""
    advantage: ClassVar[bool] = True
    window: int = Field(default=512, ge=2, le=1_000_000)
    """Responses (of the most recent accepted groups) the advantages are normalised over."""
    eps: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Added to the window's standard deviation before dividing."""


class SftSpec(_Spec):
    op: Literal["sft"] = "sft"
    """Advantage (rejection-sampling SFT): 1 for a response rewarded at least ``min_reward``, else 0."""
    advantage: ClassVar[bool] = True
    min_reward: float = 1.0
    """Responses whose producer reward is at least this are imitated (advantage 1); the rest get 0."""


class GigpoSpec(_Spec):
    op: Literal["gigpo"] = "gigpo"
    """Step-level advantage (GiGPO) for multi-turn episodes: each policy turn also gets the standardised return of
    its turn among the group's turns that answered the same observation; after the advantage operator."""
    weight: float = Field(default=1.0, gt=0.0, le=10.0)
    """ω: the step advantage's weight beside the episode advantage."""
    gamma: float = Field(default=0.95, gt=0.0, le=1.0)
    """Discount per policy turn of the episode's final reward (a turn nearer a win returns more)."""
    eps: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Added to a step group's standard deviation before dividing."""


class RewardTermsSpec(_Spec):
    op: Literal["reward_terms"] = "reward_terms"
    """Reward shaping: each reward plus Σ weight × the reward component of that name the producer reported
    (``reward_components``); before the advantage, and before ``zero_variance`` to keep groups it separates."""
    weights: dict[str, float]
    """Component name → weight, e.g. ``{invalid: -0.1}``: a tenth of a point off per invalid move."""

    @model_validator(mode="after")
    def _weighted(self) -> "RewardTermsSpec":
        if not self.weights:
            raise ValueError("weights: name at least one reward component")
        for name, weight in self.weights.items():
            if not name or not math.isfinite(weight):
                raise ValueError(f"weights: {name!r}: {weight} is not a finite weight of a named component")
        return self


class RewardNormSpec(_Spec):
    op: Literal["reward_norm"] = "reward_norm"
    """Rewrite rewards to (r − running mean) / running std; put it before the advantage."""
    eps: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Added to the running standard deviation before dividing."""
    clip: float | None = Field(default=None, gt=0.0)
    """Clip normalised rewards to ``[-clip, clip]``; unset: no clipping."""


class ReplaySpec(_Spec):
    op: Literal["replay"] = "replay"
    """Mixer: a share of the emitted samples replays recent accepted groups."""
    stage: ClassVar[Stage] = "mixer"
    ratio: float = Field(default=0.3, ge=0.0, le=0.9)
    """Fraction of the emitted samples drawn from the replay buffer (the rest are fresh)."""
    capacity: int = Field(default=64, ge=1, le=100_000)
    """Accepted groups kept in the replay buffer (oldest evicted first)."""
    selector: Literal["latest", "uniform"] = "latest"
    """Which buffered groups are replayed: the most recent ones, or uniformly at random."""
    seed: int = 0
    """Seed of the ``uniform`` selector."""


class OfflineSpec(_Spec):
    op: Literal["offline"] = "offline"
    """Mixer: a share of the emitted samples comes from another trajectory topic (e.g. an earlier run's)."""
    stage: ClassVar[Stage] = "mixer"
    topic: str = Field(min_length=1)
    """The trajectory topic to mix in (e.g. ``oldrun.trajectories.main`` of an earlier run)."""
    weight: float = Field(default=0.3, gt=0.0, le=0.9)
    """Fraction of the emitted samples taken from that topic (the rest are this run's)."""
    source: str | None = None
    """The run directory (or config file) of the run whose log holds ``topic``; unset: this run's log."""
    loop: bool = False
    """Start the topic over once it is used up; unset: mix each of its groups in once, then none."""


class FifoSpec(_Spec):
    op: Literal["fifo"] = "fifo"
    """Ordering: emit groups in the order they completed."""
    stage: ClassVar[Stage] = "ordering"


class EdfSpec(_Spec):
    op: Literal["edf"] = "edf"
    """Ordering: emit the earliest staleness deadline (version + max_staleness) first."""
    stage: ClassVar[Stage] = "ordering"


OperatorSpec = Annotated[
    Union[
        StalenessSpec,
        ZeroVarianceSpec,
        ResponseLengthSpec,
        RewardRangeSpec,
        DuplicateSpec,
        GrpoSpec,
        DrGrpoSpec,
        RlooSpec,
        ReinforcePPSpec,
        SftSpec,
        GigpoSpec,
        RewardTermsSpec,
        RewardNormSpec,
        ReplaySpec,
        OfflineSpec,
        FifoSpec,
        EdfSpec,
    ],
    Field(discriminator="op"),
]

ADVANTAGE_SPECS: dict[str, type[_Spec]] = {
    spec.model_fields["op"].default: spec for spec in (GrpoSpec, DrGrpoSpec, RlooSpec, ReinforcePPSpec, SftSpec)
}


def check_pipeline(specs: list) -> None:
    """Raise ``ValueError`` unless the specs form a runnable pipeline (called by ``StreamConfig``)."""
    names = [spec.op for spec in specs]
    advantages = [spec.op for spec in specs if spec.advantage]
    if len(advantages) != 1:
        raise ValueError(
            f"needs exactly one advantage operator ({', '.join(ADVANTAGE_SPECS)}), got {advantages or 'none'}"
        )
    advantage = advantages[0]
    order = [  # (earlier, later, the error): where both are in the pipeline, earlier must come first
        (
            "reward_norm",
            advantage,
            f"reward_norm must come before {advantage} (it rescales the rewards the advantage reads)",
        ),
        (
            "reward_terms",
            advantage,
            f"reward_terms must come before {advantage} (it changes the rewards the advantage reads)",
        ),
        ("reward_terms", "reward_norm", "reward_terms must come before reward_norm (normalise the shaped rewards)"),
        (advantage, "gigpo", f"gigpo must come after {advantage} (it adds to the episode advantages)"),
    ]
    for earlier, later, problem in order:
        if earlier in names and later in names and names.index(earlier) > names.index(later):
            raise ValueError(problem)
    rank = {"group": 0, "mixer": 1, "ordering": 2}
    ranks = [rank[spec.stage] for spec in specs]
    if ranks != sorted(ranks):
        raise ValueError(f"write group operators first, then mixers, then one ordering; got {names}")
    if sum(spec.stage == "ordering" for spec in specs) > 1:
        raise ValueError(f"at most one ordering (fifo or edf), got {names}")
    for op in sorted(set(names) - {"reward_range", "response_length"}):
        if names.count(op) > 1:
            raise ValueError(f"operator {op!r} appears {names.count(op)} times")
