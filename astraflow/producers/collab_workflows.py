"""Workflows of several policies: one policy answers, another judges the answers.

``solver_verifier`` (issue 6). The policy with ``role: answer`` answers each task G times (its
group is the task, as in ``single_turn``); for each answer the policy with ``role: judge`` sees
``<prompt><answer>?`` and judges it K times (its group is that answer): it writes the answer it
computes, and accepts the candidate when the two agree (``tasks.arithmetic.judgement``).
Rewards: the answer's exact match for the answerer; for the judge, 1 when its verdict equals
whether the answer is right (``judge_reward``). Each policy's trajectories carry its name, so the producer sends them
to that policy's topic and each is trained by its own stream processor and trainer.

Ids are deterministic: answers ``{task_id}/{i}`` in group ``{task_id}``, judgements
``{task_id}/{i}/{j}`` in group ``{task_id}/{i}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from astraflow.errors import ConfigError
from astraflow.producers.workflows import Provenance, SingleTurnWorkflow, TaskOutcome, Workflow
from astraflow.schemas.records import RolloutTask
from astraflow.tasks.arithmetic import exact_match_reward, extract_answer, judge_prompt, judge_reference, judge_reward

if TYPE_CHECKING:
    from astraflow.config import RunConfig


class AnswerJudgeWorkflow(Workflow):
    """One policy answers every task ``answers`` times; another judges each answer ``judgements`` times."""

    def __init__(self, answerer: RunConfig, judge: RunConfig) -> None:
        a, j = answerer.rollout, judge.rollout
        self.answer = SingleTurnWorkflow(answerer.policy, exact_match_reward, a.max_new_tokens, a.temperature)
        self.judge = SingleTurnWorkflow(judge.policy, judge_reward, j.max_new_tokens, j.temperature)
        self.answers = a.group_size
        self.judgements = j.group_size
        self.policies = (answerer.policy, judge.policy)

    def groups_per_task(self, policy: str) -> int:
        return self.answers if policy == self.judge.policy else 1

    def run_batch(self, engines: Mapping[str, object], tasks: list[RolloutTask], provenance: Provenance) -> list[TaskOutcome]:
        answered = self.answer.run_batch(engines, [replace(t, group_size=self.answers) for t in tasks], provenance)
        judged_tasks: list[RolloutTask] = []
        owners: list[int] = []
        for index, outcome in enumerate(answered):
            if outcome.error is not None:
                continue
            for answer in outcome.trajectories:
                judged_tasks.append(self.judging_task(outcome.task, answer.trajectory_id, answer.response_text))
                owners.append(index)
        judged = self.judge.run_batch(engines, judged_tasks, provenance) if judged_tasks else []
        outcomes = [TaskOutcome(task, list(outcome.trajectories), outcome.error) for task, outcome in zip(tasks, answered)]
        for index, outcome in zip(owners, judged):
            target = outcomes[index]
            if target.error is not None:
                continue
            if outcome.error is not None:
                target.trajectories, target.error = [], outcome.error
                continue
            target.trajectories.extend(outcome.trajectories)
        return outcomes

    def judging_task(self, task: RolloutTask, answer_id: str, answer_text: str) -> RolloutTask:
        """The task the judge gets for one answer: its reference is the right answer and the candidate."""
        candidate = extract_answer(answer_text)
        return replace(
            task,
            task_id=answer_id,
            group_id=answer_id,
            prompt_id=f"{task.prompt_id}?{candidate}",
            prompt=judge_prompt(task.prompt, candidate),
            reference=judge_reference(task.reference, candidate),
            group_size=self.judgements,
        )


def build_collab_workflow(kind: str, policies: list[RunConfig]) -> Workflow:
    """The multi-policy workflow ``kind`` over the policies' narrowed configs."""
    if kind != "solver_verifier":
        raise ConfigError(f"rollout.workflow: {kind!r} is not a multi-policy workflow")
    by_role = {cfg.role: cfg for cfg in policies}
    if sorted(by_role) != ["answer", "judge"] or len(policies) != 2:
        raise ConfigError("policies: 'solver_verifier' needs exactly one policy with role 'answer' and one with role 'judge'")
    return AnswerJudgeWorkflow(by_role["answer"], by_role["judge"])
