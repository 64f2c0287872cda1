"""What the trainer checks of each sample it reads (step 1 of ``component.py``), and the feedback of
the stale groups it drops.

A sample that does not decode, or that the model cannot train on (``schemas.validation``: token ids
outside the vocabulary, prompt + response beyond the context length, a loss mask other than 0/1,
non-finite or positive log-probs, negative token versions; here also a sample id that is empty, too
long or holds a control character, an advantage that is not a finite float32, token advantages that do
not match the response, and a fresh sample whose group size is not the policy's) is dead-lettered
with the reason and counted (``train.rejected_samples``); it still counts as a member of its group,
so the group completes without it instead of holding every later batch back.

A group generated more than the policy's ``max_staleness`` versions before the version being
trained is stale: it takes no place in the batch, is trained into no version, and is reported on the
feedback topic as a dropped group (``stale: ...``) in the next version's transaction
(``train.stale_samples``). The stream's staleness filter judged it when it passed; it went stale
waiting in the samples topic, which only a surplus of samples makes possible (e.g. copies of dropped
groups after a crash fed the task feeder twice): without this check every later batch would train
that surplus, ever staler.
"""

from __future__ import annotations

import numpy as np

from astraflow.log import Message
from astraflow.runtime.context import now_ms
from astraflow.schemas.records import PromptStats, TrainSample
from astraflow.schemas.validation import MAX_ID_BYTES, Limits, id_problem, validate

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: a larger advantage becomes infinite in the loss."""
MAX_SAMPLE_ID_BYTES = MAX_ID_BYTES + 64
"""The longest sample id: a trajectory id and the stream's suffix (``#offline<pass>``, ``#replay<n>``).
A version's ledger entry names every sample id of its batch, so ``train.batch_samples`` (at most
16,384) of them take at most 5.3 MiB of the ledger topic's 16 MiB."""


def sample_problem(sample: TrainSample, limits: Limits, group_size: int) -> str | None:
    """Why the model cannot train on ``sample`` (a policy of ``group_size`` samples a group), or ``None``."""
    problem = id_problem(sample.sample_id, limit=MAX_SAMPLE_ID_BYTES)
    if problem is not None:
        return f"sample_id: {problem}"
    problem = validate(sample.trajectory, limits)
    if problem is not None:
        return problem
    if not abs(sample.advantage) <= FLOAT32_MAX:
        return f"advantage: {sample.advantage!r} is not a finite float32"
    tokens = sample.token_advantages
    if len(tokens) and len(tokens) != len(sample.trajectory.response_ids):
        return f"token_advantages: {len(tokens)} values for {len(sample.trajectory.response_ids)} response tokens"
    if len(tokens) and not np.isfinite(tokens).all():
        return "token_advantages: not all finite"
    if not sample.replayed and sample.trajectory.group_size != group_size:
        return f"group_size: {sample.trajectory.group_size}, but the policy's rollout.group_size is {group_size}"
    return None


def stale_groups(stale: list[tuple[TrainSample | None, Message]]) -> dict[str, list[TrainSample]]:
    """The decoded samples of ``stale`` records by group id (dead-lettered records carry none)."""
    groups: dict[str, list[TrainSample]] = {}
    for sample, _ in stale:
        if sample is not None:
            groups.setdefault(sample.trajectory.group_id, []).append(sample)
    return groups


def stale_feedback(groups: dict[str, list[TrainSample]], policy: str, version: int, bound: int) -> list[PromptStats]:
    """One dropped-group record per stale group, for the trainer at ``version`` with staleness ``bound``."""
    feedback = []
    for group_id, members in groups.items():
        rewards = np.array([sample.trajectory.reward for sample in members], dtype=np.float64)
        first = members[0].trajectory
        oldest = min(sample.trajectory.min_version for sample in members)
        feedback.append(
            PromptStats(
                prompt_id=first.prompt_id,
                group_id=group_id,
                workflow=first.workflow,
                policy=policy,
                version=oldest,
                num_samples=len(members),
                mean_reward=float(rewards.mean()),
                reward_std=float(rewards.std()),
                pass_rate=float((rewards > 0).mean()),
                accepted=False,
                drop_reason=f"stale: {version - oldest} versions behind the trainer at version {version}"
                f" (max {bound}), dropped by the trainer",
                created_ms=now_ms(),
                trajectory_ids=[sample.trajectory.trajectory_id for sample in members],
            )
        )
    return feedback
