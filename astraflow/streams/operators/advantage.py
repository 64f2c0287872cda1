"""Advantage estimators and reward normalisation: numpy functions, and the operators that apply them.

Notation: one group holds the G responses to one prompt, r its rewards [G]; each response's
advantage is broadcast to its tokens by the trainer.

- GRPO (DeepSeekMath, Shao et al. 2024): A_i = (r_i − mean(r)) / (std(r) + eps). ``std`` is the
  sample standard deviation (ddof = 1), as in TRL and verl, which use ``torch.std``.
- Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-like training"): A_i = r_i − mean(r), no std.
  Its other half, summing token losses and dividing by a constant instead of each response's
  length, is the trainer's aggregation ``seq-mean-token-sum-norm`` (``training/step.py``);
  pair the two in the run config.
- RLOO (Ahmadian et al. 2024): A_i = r_i − mean_{j≠i} r_j = G/(G−1) · (r_i − mean(r)).
- REINFORCE++ baseline (Hu 2025): A_i = r_i − mean(r), then whitened by the mean and std over the
  training batch. Departure: a stream processor never sees the trainer's batch, so the
  statistics are those of the last ``window`` responses (this group included), each response
  counted once rather than once per token, population std (ddof = 0).
- Rejection-sampling SFT (RAFT, Dong et al. 2023; the filtered behaviour cloning of ReST,
  Gulcehre et al. 2023): A_i = 1 when r_i ≥ ``min_reward``, else 0, so the trainer's policy loss
  becomes the log-likelihood of the rewarded responses (importance-weighted against the behaviour
  log-probs and capped like every other sample). Departure: the unrewarded responses stay in the
  batch with advantage 0 (filters drop whole groups, never single responses), so they add nothing
  to the gradient but count in the ``token-mean`` denominator; put ``reward_range`` before it to
  drop groups with no rewarded response at all.
- GiGPO's step-level advantage (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent
  Training"), for multi-turn episodes whose members share one environment (a group plays one task):
  each policy turn's anchor state is the observation it answers (the prompt for the first turn, else
  the environment's or tool's tokens since the previous policy turn); the turns of the group that
  answer the same observation form a step group; a turn's return is γ^(K − 1 − k) r for turn k of
  an episode of K policy turns and reward r (the reward comes at the end); its step advantage is its
  return standardised within its step group (0 in a step group of one, or of equal returns). The
  turn's tokens get the episode's advantage (from the advantage operator before it) plus ω times
  its step advantage. Where the episode-level advantage credits a whole episode, this one credits
  the turn that made the difference: of the turns that saw the same room, the ones whose episodes
  went on to win sooner.
- Reward terms (shaping): r ← r + Σ_k w_k c_k, with c_k the components the producer reported with the
  reward (``reward_components``: the rooms game's ``invalid`` moves, a code episode's ``attempts``),
  the way TRL's ``reward_weights`` combines reward functions. A member without a named component
  fails the group (dead-lettered with the name), never counted as 0.
- Reward normalisation: r ← (r − μ) / (σ + eps) with μ, σ the running mean and population std of
  every reward seen so far (Chan et al.'s parallel update, O(1) memory).

The REINFORCE++ window and the normalisation statistics are operator state (``state_dict``, as
JSON whose floats round-trip exactly): the native runtime journals them with its commits, so a
restarted processor computes the same advantages as one that never stopped.

A group of one has no spread and gets advantage 0. A group whose rewards are all equal carries no
signal under any of these: DAPO's dynamic sampling drops it (``is_zero_variance``) and counts it.
"""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np

from astraflow.schemas.records import Trajectory, Turn
from astraflow.streams.operators.base import Group, TrajectoryLookup, register


def _checked(rewards: np.ndarray) -> np.ndarray:
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"rewards must be a non-empty 1-D array, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {values.tolist()}")
    return values


def mean_std(values: list[float], ddof: int = 0) -> tuple[float, float]:
    """Mean and standard deviation of a group's few values, in plain Python: numpy's per-call
    overhead is most of its cost at group sizes (this runs for every group the stream sees)."""
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def grpo_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages [G] float32 of one group's rewards [G]; raises ``ValueError`` on non-finite rewards."""
    values = _checked(rewards)
    if values.size == 1:
        return np.zeros(1, dtype=np.float32)
    mean, std = mean_std(values.tolist(), ddof=1)
    return ((values - mean) / (std + eps)).astype(np.float32)


def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr.GRPO advantages [G] float32: the rewards minus the group mean."""
    values = _checked(rewards)
    return (values - values.mean()).astype(np.float32)


def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """RLOO advantages [G] float32: each reward minus the mean of the other G − 1."""
    values = _checked(rewards)
    if values.size == 1:
        return np.zeros(1, dtype=np.float32)
    return (values.size / (values.size - 1) * (values - values.mean())).astype(np.float32)


def is_zero_variance(rewards: np.ndarray, atol: float = 1e-9) -> bool:
    """True when every reward of the group is equal (within ``atol``): no learning signal."""
    values = np.asarray(rewards, dtype=np.float64).tolist()
    if any(v != v for v in values):  # NaN: max and min would skip it
        return False
    return not values or max(values) - min(values) <= atol


@register
class GrpoAdvantage:
    """GRPO: each response's reward standardised within its group."""

    name = "grpo"

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.advantages = grpo_advantages(group.rewards, self.eps)
        return None


@register
class DrGrpoAdvantage:
    """Dr.GRPO: the group mean is the baseline, without the std division."""

    name = "dr_grpo"

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.advantages = dr_grpo_advantages(group.rewards)
        return None


@register
class RlooAdvantage:
    """RLOO: the mean of the group's other responses is each response's baseline."""

    name = "rloo"

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.advantages = rloo_advantages(group.rewards)
        return None


@register
class ReinforcePPAdvantage:
    """REINFORCE++ baseline: group-centred rewards whitened over a window of recent responses.

    Put filters (zero_variance, staleness) before it: every group it sees enters the window.
    """

    name = "reinforce_pp"

    def __init__(self, window: int = 512, eps: float = 1e-6) -> None:
        self.eps = eps
        self._recent: deque[float] = deque(maxlen=window)  # centred rewards of the last `window` responses

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        centred = dr_grpo_advantages(group.rewards).astype(np.float64)  # [G]
        self._recent.extend(centred.tolist())
        recent = np.fromiter(self._recent, dtype=np.float64)  # [min(window, seen)]
        group.advantages = ((centred - recent.mean()) / (recent.std() + self.eps)).astype(np.float32)
        return None

    def state_dict(self) -> bytes:
        return json.dumps({"recent": list(self._recent)}).encode()

    def load_state_dict(self, state: bytes, lookup: TrajectoryLookup) -> None:
        self._recent = deque(json.loads(state)["recent"], maxlen=self._recent.maxlen)


def anchor_states(trajectory: Trajectory) -> list[tuple[Turn, bytes]]:
    """Each policy turn of ``trajectory`` with the observation it answers, as bytes (GiGPO's anchor
    state): the prompt's tokens for a turn that opens the response, else the tokens between the previous
    policy turn and this one (what the environment or tool said)."""
    anchors, after = [], 0  # after: where the previous policy turn ended
    for turn in trajectory.turns:
        if turn.role != "policy":
            continue
        observed = trajectory.prompt_ids if turn.start == 0 else trajectory.response_ids[after : turn.start]
        anchors.append((turn, np.ascontiguousarray(observed, dtype=np.int32).tobytes()))
        after = turn.end
    return anchors


def gigpo_token_advantages(
    trajectories: list[Trajectory],
    rewards: np.ndarray,
    episode_advantages: np.ndarray,
    weight: float,
    gamma: float,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """GiGPO's advantages of one group: for each member, [R] float32, its episode advantage on every token
    plus ``weight`` times each policy turn's step advantage on that turn's tokens (see the module docstring)."""
    values = _checked(rewards)
    # each member's policy turns as (turn, anchor state, return)
    turns = [
        [(turn, state, gamma ** (len(anchors) - 1 - k) * reward) for k, (turn, state) in enumerate(anchors)]
        for anchors, reward in zip(map(anchor_states, trajectories), values.tolist(), strict=True)
    ]
    returns: dict[bytes, list[float]] = {}  # anchor state -> returns of the turns that answered it
    for member in turns:
        for _, state, turn_return in member:
            returns.setdefault(state, []).append(turn_return)
    stats = {state: mean_std(seen, ddof=1) for state, seen in returns.items() if len(seen) > 1}
    out = []
    for trajectory, member, episode in zip(trajectories, turns, episode_advantages, strict=True):
        tokens = np.full(len(trajectory.response_ids), float(episode), dtype=np.float32)
        for turn, state, turn_return in member:
            if state in stats:
                mean, std = stats[state]
                tokens[turn.start : turn.end] += np.float32(weight * (turn_return - mean) / (std + eps))
        out.append(tokens)
    return out


@register
class GigpoStepAdvantage:
    """GiGPO: adds to each policy turn the advantage of its return among the group's turns that saw the same
    observation. Comes after the advantage operator, whose episode advantages it builds on."""

    name = "gigpo"

    def __init__(self, weight: float = 1.0, gamma: float = 0.95, eps: float = 1e-6) -> None:
        self.weight, self.gamma, self.eps = weight, gamma, eps

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        if group.advantages is None:
            raise ValueError("gigpo needs the episode advantages of an advantage operator before it")
        group.token_advantages = gigpo_token_advantages(
            group.trajectories, group.rewards, group.advantages, self.weight, self.gamma, self.eps
        )
        return None


def sft_advantages(rewards: np.ndarray, min_reward: float) -> np.ndarray:
    """Rejection-sampling SFT advantages [G] float32: 1 for rewards of at least ``min_reward``, else 0."""
    return (_checked(rewards) >= min_reward).astype(np.float32)


@register
class SftAdvantage:
    """Rejection-sampling SFT: imitate the rewarded responses, ignore the others.

    Reads the producers' rewards (``raw_rewards``), so a ``reward_norm`` before it changes nothing.
    """

    name = "sft"

    def __init__(self, min_reward: float = 1.0) -> None:
        self.min_reward = min_reward

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.advantages = sft_advantages(group.raw_rewards, self.min_reward)
        return None


def shaped_rewards(trajectories: list[Trajectory], rewards: np.ndarray, weights: dict[str, float]) -> np.ndarray:
    """[G] float64: each member's reward plus Σ weight × its reward component of that name; ``ValueError``
    naming the member and the component when one is missing or not finite."""
    shaped = _checked(rewards).copy()
    for index, trajectory in enumerate(trajectories):
        for name, weight in weights.items():
            value = trajectory.reward_components.get(name)
            if value is None or not math.isfinite(value):
                have = ", ".join(sorted(trajectory.reward_components)) or "none"
                problem = "has no" if value is None else f"has a non-finite ({value})"
                raise ValueError(
                    f"reward_terms: trajectory {trajectory.trajectory_id} {problem} reward component {name!r} "
                    f"(its components: {have})"
                )
            shaped[index] += weight * value
    return shaped


@register
class RewardTerms:
    """Reward shaping: adds weighted reward components to the group's rewards (before the advantage)."""

    name = "reward_terms"

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = dict(weights)

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        group.rewards = shaped_rewards(group.trajectories, group.rewards, self.weights)
        return None


@register
class RewardNormaliser:
    """Rewrites the group's rewards to ``(r − μ) / (σ + eps)`` with the running μ, σ of all rewards."""

    name = "reward_norm"

    def __init__(self, eps: float = 1e-6, clip: float | None = None) -> None:
        self.eps = eps
        self.clip = clip
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the running mean

    def __call__(self, group: Group, trainer_version: int) -> str | None:
        rewards = _checked(group.rewards)
        n, mean = rewards.size, float(rewards.mean())
        delta, total = mean - self.mean, self.count + n
        with np.errstate(over="ignore", invalid="ignore"):
            m2 = self._m2 + float(((rewards - mean) ** 2).sum()) + delta * delta * self.count * n / total
            running_mean = self.mean + delta * n / total
        if not (math.isfinite(m2) and math.isfinite(running_mean)):  # the state is left as it was
            raise ValueError(f"reward_norm: rewards {rewards.tolist()} would make the running statistics non-finite")
        self._m2, self.mean, self.count = m2, running_mean, total
        normalised = (rewards - self.mean) / (np.sqrt(self._m2 / self.count) + self.eps)
        group.rewards = normalised if self.clip is None else np.clip(normalised, -self.clip, self.clip)
        return None

    def state_dict(self) -> bytes:
        return json.dumps({"count": self.count, "mean": self.mean, "m2": self._m2}).encode()

    def load_state_dict(self, state: bytes, lookup: TrajectoryLookup) -> None:
        saved = json.loads(state)
        self.count, self.mean, self._m2 = int(saved["count"]), float(saved["mean"]), float(saved["m2"])
