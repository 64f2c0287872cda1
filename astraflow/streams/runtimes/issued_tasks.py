"""The tasks a trajectory may claim: what the stream processor checks against the tasks topic.

Validation (``schemas/validation.py``) checks that a trajectory is well formed; nothing in it says the
trajectory answers a task the feeder issued, or that its prompt is that task's. An authenticated
rollout producer could otherwise have the model trained on any prompt and response it liked. So the
stream processor, which may read the tasks topic (``infra/broker/acls.py``), follows it and checks
every trajectory (``problem``):

- its ``task_id`` was issued: a ``RolloutTask`` of that id is on ``{run}.tasks.{workflow}``;
- it is that task's: the same ``prompt_id``, ``group_id``, ``workflow`` and ``group_size``;
- for the single-turn workflow, whose prompt is the task's text, its ``prompt_ids`` are exactly that
  text as every engine encodes it (``engines.base.encode_prompts``, with the policy's tokenizer and
  ``engine.chat_template``). A multi-turn episode's prompt is its environment's first observation,
  which only the environment can make again: there the task is checked, not the prompt. A judge's
  trajectory (``solver_verifier``) answers a task the workflow derives from an issued one
  (``{task_id}/{k}``, prompt id ``{prompt_id}?``): the issued task and the derivation are checked.

The index is read on demand: a task id not seen yet makes it read the tasks topic up to its end
offsets of that moment (a trajectory's task was committed before any producer could read it), for at
most ``CATCH_UP_S``. It keeps, per task, its ids and - where prompts are checked - its prompt text.

Which runs check (``stream.verify_tasks``): on by ``auto`` where the log authenticates roles (Kafka with
``role_credentials``), the one setting where a producer cannot write the task it names too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from astraflow.core.errors import AstraFlowError
from astraflow.log import TopicPartition
from astraflow.runtime.base_checkpoint import base_checkpoint_dir
from astraflow.schemas.records import RolloutTask, Trajectory

if TYPE_CHECKING:
    from astraflow.runtime.context import ComponentContext

CATCH_UP_S = 5.0
"""Longest a check waits for the tasks topic to be read up to its end offsets of that moment."""


@dataclass(frozen=True)
class IssuedTask:
    prompt_id: str
    group_id: str
    workflow: str
    group_size: int
    prompt: str | None
    """The task's text, kept only where prompts are checked."""


def verifies_tasks(ctx: ComponentContext) -> bool:
    """Whether ``stream.verify_tasks`` asks for the check in this run."""
    mode = ctx.config.stream.verify_tasks
    if mode == "auto":
        return ctx.config.log.backend == "kafka" and bool(ctx.config.log.security.role_credentials)
    return mode == "on"


class IssuedTasks:
    """The tasks topic of the run, read as far as the checks need, and the check of a trajectory."""

    def __init__(self, ctx: ComponentContext, policy: str) -> None:
        self.ctx = ctx
        self.topic = ctx.topics.tasks()
        narrowed = ctx.config.for_policy(policy) if ctx.config.policies else ctx.config
        self.judge = ctx.config.rollout.workflow == "solver_verifier" and narrowed.role == "judge"
        self.prompts = narrowed.rollout.workflow == "single_turn" and not self.judge
        self.chat_template = narrowed.engine.chat_template
        self._tokenizer = None
        self._base = base_checkpoint_dir(narrowed, ctx.run_dir)
        self.tasks: dict[str, IssuedTask] = {}
        self.consumer = ctx.log.consumer(group_id=None)
        self.partitions = [TopicPartition(self.topic, p) for p in range(ctx.log.describe_topic(self.topic).partitions)]
        self.consumer.assign(self.partitions)
        self.consumer.seek_to_beginning(self.partitions)

    def problem(self, trajectory: Trajectory) -> str | None:
        """Why ``trajectory`` is not its task's, or ``None`` when it is."""
        task_id = trajectory.task_id.rsplit("/", 1)[0] if self.judge else trajectory.task_id
        task = self.tasks.get(task_id)
        if task is None:
            self._catch_up(task_id)
            task = self.tasks.get(task_id)
        if task is None:
            return f"task_id: {task_id!r} was never issued on {self.topic}"
        claimed = (trajectory.prompt_id, trajectory.group_id, trajectory.workflow, trajectory.group_size)
        issued = (task.prompt_id, task.group_id, task.workflow, task.group_size)
        if self.judge:  # a judgement of the task: one sample in a group of the judge's own size
            claimed, issued = claimed[:3], (f"{task.prompt_id}?", *issued[1:3])
        for name, mine, theirs in zip(("prompt_id", "group_id", "workflow", "group_size"), claimed, issued):
            if mine != theirs:
                return f"{name}: {mine!r} is not that of task {task_id!r} ({theirs!r})"
        if task.prompt is not None:
            expected = self._encode(task.prompt)
            if not np.array_equal(expected, trajectory.prompt_ids):
                return (
                    f"prompt_ids: not the prompt of task {trajectory.task_id!r} ({len(trajectory.prompt_ids)} ids;"
                    f" the task's prompt encodes to {len(expected)})"
                )
        return None

    def _catch_up(self, wanted: str) -> None:
        ends = self.ctx.log.end_offsets(self.topic)
        deadline = time.monotonic() + CATCH_UP_S
        while wanted not in self.tasks and time.monotonic() < deadline:
            if all(self.consumer.position(tp) >= ends.get(tp.partition, 0) for tp in self.partitions):
                return
            for message in self.consumer.poll(max_records=5000, timeout=0.2):
                try:
                    task = self.ctx.codec.decode(message.value, expect=RolloutTask)
                except AstraFlowError:
                    continue  # the producers dead-letter an undecodable task; no trajectory can name it
                prompt = task.prompt if self.prompts else None
                self.tasks[task.task_id] = IssuedTask(
                    task.prompt_id, task.group_id, task.workflow, task.group_size, prompt
                )

    def _encode(self, prompt: str) -> np.ndarray:
        if self._tokenizer is None:
            from astraflow.engines.loading import load_tokenizer

            self._tokenizer = load_tokenizer(self._base)
        from astraflow.engines.base import encode_prompts

        return encode_prompts(self._tokenizer, [prompt], self.chat_template)[0]

    def close(self) -> None:
        self.consumer.close()
