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

The limits of the model (vocabulary, context) come from the base checkpoint's ``config.json``
(``models.base.model_limits``); a run whose base checkpoint the stream cannot see checks neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from astraflow.schemas.records import Trajectory


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
    reward = trajectory.reward
    if not math.isfinite(reward):
        return f"reward: non-finite {reward!r}"
    if abs(reward) > limits.max_abs_reward:
        return f"reward: {reward:.6g} is beyond stream.max_abs_reward ({limits.max_abs_reward:.6g})"
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
