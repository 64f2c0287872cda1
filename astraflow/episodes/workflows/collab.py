"""Workflows of several policies: one policy answers, another judges the answers.

``solver_verifier`` (issue 6). The policy with ``role: answer`` answers each task G times (its
group is the task, as in ``single_turn``). The policy with ``role: judge`` makes J judgements of
the task's claims (J its ``group_size``; judgement j is of claim j mod G, so with J = G each claim
is judged once, as the AstraFlow paper's verifier judges each answer once). A judgement sees
``<prompt><candidate>?``, writes the answer the judge computes, and accepts the candidate when the
two agree (``tasks.arithmetic.judgement``). The J judgements of a task are one group: the GRPO
baseline of a judgement is the mean over the task's claims, true and false ones alike.

Which claims (``balanced_candidates``): claim i is the answerer's answer i for even i, and for odd
i the *contrast* of answer i − 1: the reference when that answer was wrong, a near miss of the
reference when it was right. Every pair of claims holds one true and one false candidate, whatever
the answerer's accuracy, as the held-out judging rows do. Judging only the answerer's own answers,
K times each in groups per answer (the first design), taught the judge its partner's class balance
instead: while the answerer was mostly wrong, rejecting everything scored ~0.6, the judge stopped
copying and wrote garbage, every judgement of an answer then earned the same reward, and 94-99% of
its groups were dropped for zero variance (held-out judgement accuracy 0.545 → 0.52).

Rewards: exact match for the answerer; for the judge (``judge_answer_reward``) half for a right
verdict and half for writing the right sum. A verdict alone rewards any wrong sum written under a
false claim as much as the right one, so RL taught the judge worse arithmetic (0.67 → 0.53 in 64
versions, measured); with the sum's half, the ranking is: the sum (1) > copying the candidate
(1 when true, 0 when false) > a wrong sum (0 when true, 0.5 when false). Each policy's trajectories
carry its name, so the producer sends them to that policy's topic, trained by its own stream
processor and trainer. The judge is warmed up on false claims only (``load_policy_split``). So
made, the judge learns: 0.67 → 0.84 held-out judgement accuracy in 136 versions of the
benchmark's single-process loop, 0.67 → 0.775 in the 4-minute end-to-end run.

Ids are deterministic (near misses too: drawn from a CRC of the claim's id): answers
``{task_id}/{i}`` in group ``{task_id}``, judgements ``{task_id}/{j}/0`` in group ``{task_id}``
(on the judge's own topics).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from astraflow.core.errors import ConfigError
from astraflow.engines.base import Engine
from astraflow.episodes.workflows.base import Provenance, TaskOutcome, Workflow
from astraflow.episodes.workflows.single_turn import SingleTurnWorkflow
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import exact_match_reward, extract_answer, judge_prompt, judge_reference, judge_reward

if TYPE_CHECKING:
    from astraflow.config import RunConfig


NEAR_MISSES = (-10, -2, -1, 1, 2, 10)
"""Offsets of a false claim made from a right answer: the slips of ``tasks.arithmetic.judge_problems``."""


def near_miss(answer: str, salt: str) -> str:
    """A wrong candidate close to ``answer``, the same for the same ``salt`` on every machine."""
    if not answer.isdigit():
        return answer + "0"
    offset = NEAR_MISSES[zlib.crc32(salt.encode()) % len(NEAR_MISSES)]
    return str(int(answer) + offset if int(answer) + offset >= 0 else int(answer) - offset)


def balanced_candidates(answer: str, answers: Sequence[str], salt: str) -> list[str]:
    """The judge's claims about one task (``answer`` the reference): answer i for even i; for odd i
    the contrast of answer i − 1 (the reference if it was wrong, a near miss if it was right)."""
    claims = []
    for index, given in enumerate(answers):
        if index % 2 == 0:
            claims.append(given)
        else:
            claims.append(near_miss(answer, f"{salt}/{index}") if answers[index - 1] == answer else answer)
    return claims


def judge_answer_reward(response_text: str, reference: str) -> float:
    """Half for a right verdict on the candidate (``judge_reward``), half for writing the right sum."""
    return 0.5 * judge_reward(response_text, reference) + 0.5 * exact_match_reward(
        response_text, reference.split("|", 1)[0]
    )


class AnswerJudgeWorkflow(Workflow):
    """One policy answers every task ``answers`` times; another makes ``judgements`` judgements of its claims."""

    def __init__(self, answerer: RunConfig, judge: RunConfig) -> None:
        a, j = answerer.rollout, judge.rollout
        self.answer = SingleTurnWorkflow(answerer.policy, exact_match_reward, a.max_new_tokens, a.temperature)
        self.judge = SingleTurnWorkflow(judge.policy, judge_answer_reward, j.max_new_tokens, j.temperature)
        self.answers = a.group_size
        self.judgements = j.group_size
        self.policies = (answerer.policy, judge.policy)

    def run_batch(
        self, engines: Mapping[str, Engine], tasks: list[RolloutTask], provenance: Provenance
    ) -> list[TaskOutcome]:
        answered = self.answer.run_batch(engines, [replace(t, group_size=self.answers) for t in tasks], provenance)
        judged_tasks: list[RolloutTask] = []
        owners: list[int] = []
        for index, outcome in enumerate(answered):
            if outcome.error is not None:
                continue
            given = [extract_answer(answer.response_text) for answer in outcome.trajectories]
            claims = balanced_candidates(outcome.task.reference.strip(), given, outcome.task.task_id)
            for judgement in range(self.judgements):
                judged_tasks.append(self.judging_task(outcome.task, judgement, claims[judgement % len(claims)]))
                owners.append(index)
        judged = self.judge.run_batch(engines, judged_tasks, provenance) if judged_tasks else []
        outcomes = [
            TaskOutcome(task, list(outcome.trajectories), outcome.error) for task, outcome in zip(tasks, answered)
        ]
        for index, outcome in zip(owners, judged):
            target = outcomes[index]
            if target.error is not None:
                continue
            if outcome.error is not None:
                target.trajectories, target.error = [], outcome.error
                continue
            target.trajectories.extend(replace(t, group_size=self.judgements) for t in outcome.trajectories)
        return outcomes

    def judging_task(self, task: RolloutTask, judgement: int, candidate: str) -> RolloutTask:
        """Judgement ``judgement`` of ``task``, of ``candidate``: one sample in the task's group, whose
        reference is the right answer and the candidate; its prompt id ``{prompt_id}?`` keeps the judge's
        feedback apart from the answerer's for the same prompt."""
        return replace(
            task,
            task_id=f"{task.task_id}/{judgement}",
            prompt_id=f"{task.prompt_id}?",
            prompt=judge_prompt(task.prompt, candidate),
            reference=judge_reference(task.reference, candidate),
            group_size=1,
        )


def build_collab_workflow(kind: str, policies: list[RunConfig]) -> Workflow:
    """The multi-policy workflow ``kind`` over the policies' narrowed configs."""
    if kind != "solver_verifier":
        raise ConfigError(f"rollout.workflow: {kind!r} is not a multi-policy workflow")
    by_role = {cfg.role: cfg for cfg in policies}
    if sorted(by_role) != ["answer", "judge"] or len(policies) != 2:
        raise ConfigError(
            "policies: 'solver_verifier' needs exactly one policy with role 'answer' and one with role 'judge'"
        )
    return AnswerJudgeWorkflow(by_role["answer"], by_role["judge"])
