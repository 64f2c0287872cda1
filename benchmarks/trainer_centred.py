"""The trainer-centred baseline of benchmarks/multi_policy.py: one process, one loop, in turn.

    generate for both policies -> train the solver -> train the verifier -> reload -> repeat

the way verl-style colocated synchronous systems run a multi-policy job. It is built from
AstraFlow's own parts so that only the schedule differs: the run config's workflow
(``build_run_workflow``: the same episodes, rewards and ids), each policy's stream pipeline
(``build_pipeline``: the same advantages and filters), and each policy's learner, built as the
trainer builds it (``step_config`` and ``build_learner`` of ``training.learner``: the same loss
and optimizer from the same YAML, or the same simulated step). Tasks come
in the feeder's order. A generation round asks for one solver batch of tasks; rounds repeat
until every policy has a full batch of accepted samples (dynamic sampling refills, as the
AstraFlow feeder does); then each policy takes one step per full batch it holds, and leftovers
wait for the next iteration. ``replicas`` engines per policy share each round's tasks, one
thread per replica (a colocated system generates on every GPU at once).
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from astraflow.config import RunConfig
from astraflow.episodes.workflows.base import Provenance
from astraflow.episodes.workflows.factory import build_run_workflow
from astraflow.schemas.records import RolloutTask
from astraflow.streams.operators.base import Group
from astraflow.streams.operators.pipeline import build_pipeline
from astraflow.tasks.base import Problem
from astraflow.training.step import PolicyExample, PolicyTrainer


@dataclass
class Iteration:
    """What one iteration did and how long each phase took (seconds of ``time.perf_counter``)."""

    generate_s: float = 0.0
    rounds: int = 0
    train_s: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    reload_s: float = 0.0


class TrainerCentredLoop:
    """Runs the iterations; ``learners[policy]`` trains, ``replicas[i][policy]`` generates."""

    def __init__(
        self,
        config: RunConfig,
        rows: list[Problem],
        replicas: list[dict[str, object]],
        learners: dict[str, PolicyTrainer],
    ) -> None:
        self.config = config
        self.workflow = build_run_workflow(config)
        self.policies = self.workflow.policies
        narrowed = {policy: config.for_policy(policy) for policy in self.policies}
        self.batch = {policy: narrowed[policy].train.batch_samples for policy in self.policies}
        self.pipelines = {policy: build_pipeline(narrowed[policy].stream) for policy in self.policies}
        first = narrowed[self.policies[0]]
        self.tasks_per_round = math.ceil(first.train.batch_samples / first.rollout.group_size)
        self.rows, self.cursor, self.order = rows, 0, list(range(len(rows)))
        self.replicas, self.learners = replicas, learners
        self.accepted: dict[str, list[Group]] = {policy: [] for policy in self.policies}
        self.dropped: Counter[str] = Counter()
        self.pool = ThreadPoolExecutor(max_workers=len(replicas))
        self.provenance = Provenance("trainer-centred", "local", "benchmark")

    def _tasks(self, count: int) -> list[RolloutTask]:
        """The next ``count`` tasks in the feeder's order (a seeded shuffle per epoch)."""
        tasks = []
        for _ in range(count):
            epoch, index = divmod(self.cursor, len(self.rows))
            if index == 0:
                self.order = list(range(len(self.rows)))
                random.Random(self.config.task.seed * 1_000_003 + epoch).shuffle(self.order)
            row = self.rows[self.order[index]]
            version = min(learner.version for learner in self.learners.values())
            tasks.append(
                RolloutTask(
                    f"{row.prompt_id}@{epoch}",
                    row.prompt_id,
                    f"{row.prompt_id}@{epoch}",
                    self.config.workflow,
                    row.prompt,
                    row.answer,
                    self.config.rollout.group_size,
                    version,
                    int(time.time() * 1000),
                    {"cursor": str(self.cursor)},
                )
            )
            self.cursor += 1
        return tasks

    def _generate(self) -> None:
        """One round: the tasks split over the replicas, run in parallel; groups through each policy's pipeline."""
        tasks = self._tasks(self.tasks_per_round)
        shares = [tasks[i :: len(self.replicas)] for i in range(len(self.replicas))]
        outcomes = self.pool.map(
            lambda pair: self.workflow.run_batch(pair[0], pair[1], self.provenance) if pair[1] else [],
            zip(self.replicas, shares),
        )
        members: dict[tuple[str, str], list] = defaultdict(list)
        for outcome in (o for share in outcomes for o in share):
            if outcome.error is not None:
                self.dropped["workflow_error"] += 1
                continue
            for trajectory in outcome.trajectories:
                members[trajectory.policy, trajectory.group_id].append(trajectory)
        for (policy, group_id), trajectories in members.items():
            group = Group(group_id, trajectories)
            reason = self.pipelines[policy].process(group, self.learners[policy].version)
            if reason is None:
                self.accepted[policy].append(group)
            else:
                self.dropped[f"{policy}.{reason}"] += 1

    def _ready(self, policy: str) -> int:
        return sum(len(group.trajectories) for group in self.accepted[policy])

    def _take(self, policy: str) -> list[PolicyExample]:
        """The oldest whole groups holding at least a batch (the trainer's ``BatchAssembler`` rule)."""
        examples: list[PolicyExample] = []
        while len(examples) < self.batch[policy]:
            group = self.accepted[policy].pop(0)
            examples += [
                PolicyExample(t.prompt_ids, t.response_ids, t.behaviour_logprobs, t.loss_mask, float(a))
                for t, a in zip(group.trajectories, group.advantages, strict=True)
            ]
        return examples

    def iteration(self) -> Iteration:
        done = Iteration()
        started = time.perf_counter()
        while any(self._ready(policy) < self.batch[policy] for policy in self.policies):
            self._generate()
            done.rounds += 1
        done.generate_s = time.perf_counter() - started
        for policy in self.policies:
            started, done.steps[policy] = time.perf_counter(), 0
            while self._ready(policy) >= self.batch[policy]:
                self.learners[policy].step(self._take(policy))
                done.steps[policy] += 1
            done.train_s[policy] = time.perf_counter() - started
        started = time.perf_counter()
        states = {policy: (learner.model.state_dict(), learner.version) for policy, learner in self.learners.items()}
        list(
            self.pool.map(
                lambda engines: [engines[policy].load_state_dict(*states[policy]) for policy in self.policies],
                self.replicas,
            )
        )
        done.reload_s = time.perf_counter() - started
        return done

    def close(self) -> None:
        self.pool.shutdown()
