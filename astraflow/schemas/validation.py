"""What a trajectory must satisfy to be trained on: one check, used by both stream runtimes, offline
sources and the trainer.

A record that fails is dead-lettered with a reason that starts with the field at fault
(``"reward: ..."``, ``"response_ids: ..."``), so ``astraflow tail deadletter`` and ``audit`` group
dead letters by cause. Every check guards a later stage that would otherwise fail or be misled:

- ``reward``: finite, and ``|r| <= stream.max_abs_reward``. An unbounded reward overflows the
  group statistics (``mean_std`` squares it) or gives an infinite float32 advantage.
- per-token arrays of the response length; ``behaviour_logprobs`` finite; ``loss_mask`` 0 or 1
  (a larger value would act as a loss weight).
- ``prompt_ids`` / ``response_ids``: ids in ``[0, vocabulary size)``, and prompt + response within
  the policy's context length: either would crash the trainer's forward pass at every restart.
- ``group_size``: the policy's configured group size. A smaller one completes groups early; a
  larger one leaves the group pending until ``stream.group_timeout_s``.
- ``token_versions``: not above the newest version the trainer published (a producer cannot have
  sampled with weights that do not exist yet). Checked only where versions are this run's: a
  replay or offline source carries another run's version counter.
- ids and names (``ID_FIELDS``): at most ``MAX_ID_BYTES`` (256) bytes of UTF-8 each. Ids travel again
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
from dataclasses import dataclass

import numpy as np

from astraflow.core.errors import clip
from astraflow.schemas.records import Trajectory

MAX_ID_BYTES = 256
"""The longest id or name a trajectory may carry, in UTF-8 bytes."""
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
        size = len(getattr(trajectory, name).encode("utf-8", "surrogatepass"))
        if size > MAX_ID_BYTES:
            return f"{name}: {size} bytes, more than the {MAX_ID_BYTES} an id may have"
    reward = trajectory.reward
    if not math.isfinite(reward):
        return f"reward: non-finite {reward!r}"
    if abs(reward) > limits.max_abs_reward:
        return f"reward: {reward:.6g} is beyond stream.max_abs_reward ({limits.max_abs_reward:.6g})"
    problem = _components_problem(trajectory.reward_components, limits.max_abs_reward)
    if problem is not None:
        return f"reward_components: {problem}"
    n = len(trajectory.response_ids)
    if n == 0:
        return "response_ids: empty response"
    for name in ("behaviour_logprobs", "token_versions", "loss_mask"):
        if len(getattr(trajectory, name)) != n:
            return f"{name}: {len(getattr(trajectory, name))} entries for {n} response tokens"
    if not np.isfinite(trajectory.behaviour_logprobs).all():
        return "behaviour_logprobs: non-finite values"
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
    length = len(trajectory.prompt_ids) + n
    if limits.context_length is not None and length > limits.context_length:
        return f"prompt_ids + response_ids: {length} tokens exceed the model's context length {limits.context_length}"
    if newest_version is not None:
        newest_token = int(trajectory.token_versions.max())
        if newest_token > newest_version:
            return f"token_versions: version {newest_token} is above the newest published version {newest_version}"
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
