"""What a trajectory must satisfy to be trained on: one check, used by both stream runtimes, offline
sources and the trainer.

A record that fails is dead-lettered with a reason that starts with the field at fault
(``"reward: ..."``, ``"response_ids: ..."``), so ``astraflow tail deadletter`` and ``audit`` group
dead letters by cause. Every check guards a later stage that would otherwise fail or be misled:

- ``reward``: finite, and ``|r| <= stream.max_abs_reward``. An unbounded reward overflows the
  group statistics (``mean_std`` squares it) or gives an infinite float32 advantage.
- per-token arrays of the response length; ``behaviour_logprobs`` finite and not above 0 (beyond
  ``LOGPROB_SLACK``): a probability above 1 is no engine's, and its importance weight silently
  switches the token off; ``loss_mask`` 0 or 1 (a larger value would act as a loss weight).
- ``prompt_ids`` not empty: each response token is predicted from the position before it, so a
  prompt-less sample's first one would be predicted from padding, and a batch of only such samples
  fails the trainer's forward pass at every restart.
- ``generate_ms``, ``reward_ms``: finite and not negative (they feed the producers' statistics).
- ``prompt_ids`` / ``response_ids``: ids in ``[0, vocabulary size)``, and prompt + response within
  the policy's context length: either would crash the trainer's forward pass at every restart.
- ``group_size``: the policy's configured group size. A smaller one completes groups early; a
  larger one leaves the group pending until ``stream.group_timeout_s``.
- ``token_versions``: not negative (no weights come before the base checkpoint's version 0: the
  staleness filter passes such a token whenever its bound exceeds the distance, and the trainer then
  drops the group as stale), and not above the newest version the trainer published (a producer
  cannot have sampled with weights that do not exist yet). The newest is checked only where versions
  are this run's: a replay or offline source carries another run's version counter.
- ids and names (``ID_FIELDS``): at most ``MAX_ID_BYTES`` (256) bytes of UTF-8 each, no control
  characters (a NUL or the unit separator ``\\x1f`` that readers join keys with would make two ids
  one), and those in ``REQUIRED_IDS`` not empty (every empty id is the same id: members of
  different groups, or samples the trainer's dedup takes for copies). Ids travel again
  in records a stage builds from many inputs - a group's feedback names all its trajectory ids, a
  version's ledger entry every sample id of its batch - which must still fit their topic (16 MiB):
  eight trajectories with 2 MiB ids each made a feedback record the stream could never commit, so it
  crash-looped on the same poll.
- ``reward_components``: at most ``MAX_REWARD_COMPONENTS`` (64), names within ``MAX_ID_BYTES``, values
  finite and within ``stream.max_abs_reward`` like the reward: a component enters operator state
  (``reward_terms``, then ``reward_norm``'s running sums), where 1e300 would square to ``inf``.

The limits of the model (vocabulary, context) come from the base checkpoint's ``config.json``
(``models.base.model_limits``); a run whose base checkpoint the stream cannot see checks neither.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from astraflow.core.errors import clip
from astraflow.schemas.records import DeadLetter, Metric, PromptStats, Trajectory

MAX_ID_BYTES = 256
"""The longest id or name a trajectory may carry, in UTF-8 bytes."""
MAX_PRODUCERS = 64
"""The most producers one resumed episode may list (``agent.max_resumes`` + 1 of them, at most 51)."""
MAX_REWARD_COMPONENTS = 64
"""The most named reward components one trajectory may carry."""
ID_FIELDS = (
    "trajectory_id",
    "episode_id",
    "group_id",
    "task_id",
    "prompt_id",
    "policy",
    "workflow",
    "finish_reason",
    "producer_id",
    "region",
    "hardware",
)
"""The string fields of a trajectory that name something (its free text, ``response_text``, is bounded
by the record size)."""
REQUIRED_IDS = ID_FIELDS[:7]
"""The ids a trajectory cannot be without (``finish_reason`` and the producer's labels may be empty)."""
LOGPROB_SLACK = 1e-3
"""How far above 0 a behaviour log-prob may be: rounding of an engine that reports it as text, not a
probability above 1."""
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
"""Characters no id may hold (C0 controls and DEL)."""


def clipped(text: str) -> str:
    """An id as a dead-letter reason quotes it: whole up to 64 characters, else its start and its length
    (the reason of an id rejected for its size must still say which field and why)."""
    return clip(text, 64)


@dataclass(frozen=True)
class Limits:
    """The bounds of one policy's trajectories; ``None`` leaves a bound unchecked."""

    max_abs_reward: float = math.inf
    group_size: int | None = None
    vocab_size: int | None = None
    context_length: int | None = None


def validate(trajectory: Trajectory, limits: Limits = Limits(), newest_version: int | None = None) -> str | None:
    """Why ``trajectory`` cannot be trained on (``"<field>: <problem>"``), or ``None`` when it can.

    ``newest_version``: the newest version published for the policy; ``None`` skips that check.
    """
    for name in ID_FIELDS:
        problem = id_problem(getattr(trajectory, name), required=name in REQUIRED_IDS)
        if problem is not None:
            return f"{name}: {problem}"
    reward = trajectory.reward
    if not math.isfinite(reward):
        return f"reward: non-finite {reward!r}"
    if abs(reward) > limits.max_abs_reward:
        return f"reward: {reward:.6g} is beyond stream.max_abs_reward ({limits.max_abs_reward:.6g})"
    problem = _components_problem(trajectory.reward_components, limits.max_abs_reward)
    if problem is not None:
        return f"reward_components: {problem}"
    if len(trajectory.producers) > MAX_PRODUCERS:
        return f"producers: {len(trajectory.producers)} listed, more than {MAX_PRODUCERS}"
    for producer in trajectory.producers:
        problem = id_problem(producer)
        if problem is not None:
            return f"producers: {problem}"
    if trajectory.resumes < 0:
        return f"resumes: {trajectory.resumes} is negative"
    for name in ("generate_ms", "reward_ms"):
        value = getattr(trajectory, name)
        if not (math.isfinite(value) and value >= 0):
            return f"{name}: {value!r} is not a finite, non-negative duration"
    n = len(trajectory.response_ids)
    if n == 0:
        return "response_ids: empty response"
    for name in ("behaviour_logprobs", "token_versions", "loss_mask"):
        if len(getattr(trajectory, name)) != n:
            return f"{name}: {len(getattr(trajectory, name))} entries for {n} response tokens"
    if not np.isfinite(trajectory.behaviour_logprobs).all():
        return "behaviour_logprobs: non-finite values"
    highest = float(trajectory.behaviour_logprobs.max())
    if highest > LOGPROB_SLACK:
        return f"behaviour_logprobs: {highest:.6g} is above 0 (a probability above 1)"
    if trajectory.loss_mask.max() > 1:
        return f"loss_mask: values must be 0 or 1, found {int(trajectory.loss_mask.max())}"
    if trajectory.group_size < 1:
        return f"group_size: {trajectory.group_size} (an empty group)"
    if limits.group_size is not None and trajectory.group_size != limits.group_size:
        return f"group_size: {trajectory.group_size}, but the policy's rollout.group_size is {limits.group_size}"
    for name in ("prompt_ids", "response_ids"):
        problem = _token_problem(getattr(trajectory, name), limits.vocab_size)
        if problem is not None:
            return f"{name}: {problem}"
    if not len(trajectory.prompt_ids):
        return "prompt_ids: empty prompt"
    length = len(trajectory.prompt_ids) + n
    if limits.context_length is not None and length > limits.context_length:
        return f"prompt_ids + response_ids: {length} tokens exceed the model's context length {limits.context_length}"
    oldest_token = int(trajectory.token_versions.min())
    if oldest_token < 0:
        return f"token_versions: negative version {oldest_token}"
    if newest_version is not None:
        newest_token = int(trajectory.token_versions.max())
        if newest_token > newest_version:
            return f"token_versions: version {newest_token} is above the newest published version {newest_version}"
    return None


def id_problem(value: str, required: bool = True, limit: int = MAX_ID_BYTES) -> str | None:
    """Why ``value`` cannot be an id (empty where ``required``, over ``limit`` bytes of UTF-8, a control
    character), or ``None``."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > limit:
        return f"{size} bytes, more than the {limit} an id may have"
    if required and not size:
        return "empty"
    found = CONTROL.search(value)
    if found is not None:
        return f"control character U+{ord(found.group()):04X} at {found.start()} in {clipped(value)!r}"
    return None


def _token_problem(ids: np.ndarray, vocab_size: int | None) -> str | None:
    if not ids.size:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
        return f"negative token id {low}"
    if vocab_size is not None and high >= vocab_size:
        return f"token id {high} is not below the vocabulary size {vocab_size}"
    return None


def _components_problem(components: dict[str, float], max_abs: float) -> str | None:
    if len(components) > MAX_REWARD_COMPONENTS:
        return f"{len(components)} components, more than {MAX_REWARD_COMPONENTS}"
    for name, value in components.items():
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > MAX_ID_BYTES:
            return f"a name of {size} bytes, more than the {MAX_ID_BYTES} a name may have"
        if not math.isfinite(value):
            return f"{name!r} is non-finite ({value!r})"
        if abs(value) > max_abs:
            return f"{name!r} is {value:.6g}, beyond stream.max_abs_reward ({max_abs:.6g})"
    return None


def feedback_problem(
    stats: PromptStats, policies: tuple[str, ...] | None = None, max_abs_reward: float = math.inf
) -> str | None:
    """Why a group's feedback record cannot be what a stream or trainer wrote (``"<field>: ..."``), or
    ``None``. The feeder counts a dropped group's record as a task to give back and its curator keeps
    per-prompt statistics of each: a NaN pass rate never filters its prompt again, one above 1 filters
    it for good, and an unknown policy would be given tasks of a policy the run does not have."""
    for name in ("prompt_id", "group_id", "workflow", "policy"):
        problem = id_problem(getattr(stats, name))
        if problem is not None:
            return f"{name}: {problem}"
    if policies is not None and stats.policy not in policies:
        return f"policy: {stats.policy!r} is not a policy of this run ({', '.join(policies)})"
    if stats.version < 0:
        return f"version: negative version {stats.version}"
    if stats.num_samples < 1:
        return f"num_samples: {stats.num_samples} (a group has at least one sample)"
    if stats.trajectory_ids and len(stats.trajectory_ids) != stats.num_samples:  # none: written before they were
        return f"trajectory_ids: {len(stats.trajectory_ids):,} ids for {stats.num_samples} samples"
    for index, trajectory_id in enumerate(stats.trajectory_ids):
        problem = id_problem(trajectory_id)
        if problem is not None:
            return f"trajectory_ids: id {index}: {problem}"
    for name, low, high in (
        ("mean_reward", -max_abs_reward, max_abs_reward),
        ("reward_std", 0.0, max_abs_reward),
        ("pass_rate", 0.0, 1.0),
    ):
        value = getattr(stats, name)
        if not (math.isfinite(value) and low <= value <= high):
            return f"{name}: {value!r} is not a finite value in [{low:.6g}, {high:.6g}]"
    return None


MAX_LABELS = 64
"""The most labels one metric may carry (each a Prometheus series dimension)."""
MAX_LABEL_BYTES = 4096
"""The longest label value (the scaler's ``reason`` is a sentence)."""


def metric_problem(metric: Metric) -> str | None:
    """Why ``metric`` cannot be a component's measurement, whoever wrote it (``runtime/control.py``
    judges the writer): a name or component that is no id, a value that is not finite, labels
    beyond ``MAX_LABELS`` or ``MAX_LABEL_BYTES``."""
    for name in ("component", "name"):
        problem = id_problem(getattr(metric, name))
        if problem is not None:
            return f"{name}: {problem}"
    if not math.isfinite(metric.value):
        return f"value: non-finite {metric.value!r}"
    if len(metric.labels) > MAX_LABELS:
        return f"labels: {len(metric.labels):,} labels, more than {MAX_LABELS}"
    for key, value in metric.labels.items():
        problem = id_problem(key)
        if problem is None and len(value.encode("utf-8", "surrogatepass")) > MAX_LABEL_BYTES:
            problem = f"value of {len(value.encode('utf-8', 'surrogatepass')):,} bytes, more than {MAX_LABEL_BYTES}"
        if problem is not None:
            return f"labels: {clipped(key)!r}: {problem}"
    return None


def letter_problem(letter: DeadLetter) -> str | None:
    """Why ``letter`` cannot be a component's dead letter, whoever wrote it: no origin or reason, or a
    position that is no record's (``-1``: a record re-encoded or no record at all)."""
    for name in ("origin", "reason"):
        if not getattr(letter, name):
            return f"{name}: empty"
    problem = id_problem(letter.origin)
    if problem is not None:
        return f"origin: {problem}"
    if letter.topic:
        problem = id_problem(letter.topic)
        if problem is not None:
            return f"topic: {problem}"
    for name in ("partition", "offset"):
        if getattr(letter, name) < -1:
            return f"{name}: {getattr(letter, name)} is no position"
    if not letter.topic and (letter.partition, letter.offset) != (-1, -1):
        return f"topic: none, but a position {letter.partition}@{letter.offset}"
    return None
