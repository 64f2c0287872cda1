"""Every metric name of a run, one constant each, grouped by the component that emits it.

Components write metrics with ``ComponentContext.metric(name, value, step, **labels)`` to their
role's ``{run}.metrics.{role}``; the run monitor, dashboard, ``astraflow stats`` / ``report``, the scaler and
the launcher pick them out by name, believing a name only from the role its prefix names
(``runtime/control.py``: ``feeder.``, ``rollout.``, ``stream.``, ``train.``, ``eval.``, ``scaler.``,
``launcher.``). Both sides take the name from here, so a name is spelled once.
Every record also carries the label ``instance`` (the emitting process); other labels are noted
per name. Names built from a part known only at run time (a trainer figure, a drop kind, a
system-evaluation figure) have a prefix constant, for readers, and a function that builds them.

``kind(name)`` says how exporters (``astraflow metrics serve``, TensorBoard) treat a name: a
``counter`` (a cumulative count, per emitting process), a ``histogram`` (one record per event,
whose distribution matters; ``histogram_buckets`` gives its bucket bounds) or a ``gauge``.

This module imports nothing from ``astraflow``: it is at the bottom of the layers.
"""

from __future__ import annotations

# feeder (producers/feeder/component.py): emitted after each round that submitted tasks

FEEDER_SUBMITTED = "feeder.submitted"
"""Tasks written to the tasks topic so far (count, cumulative; a restarted feeder starts from the
topic's end offsets). ``step``: the slowest policy's trainer version the feeder follows (at least 0)."""

FEEDER_SKIPPED = "feeder.skipped"
"""Candidate prompts the curator passed over since this feeder process started (count, cumulative),
labelled ``curator``. ``step``: as ``feeder.submitted``."""

# rollout producers (producers/rollout/component.py)

ROLLOUT_PREFIX = "rollout."
"""What every rollout producer's metric name starts with (readers use it to tell producers apart)."""

ROLLOUT_WEIGHTS_APPLIED_MS = "rollout.weights_applied_ms"
"""Latency from the trainer publishing a weight version to this producer's engine applying it
(milliseconds, wall clock), labelled ``policy``. ``step``: the weight version applied."""

ROLLOUT_BUSY_SECONDS = "rollout.busy_seconds"
"""Seconds this producer process spent generating batches so far (seconds, cumulative), labelled
``region`` and ``hardware``. ``step``: the oldest weight version among its engines."""

ROLLOUT_SAMPLES_PER_S = "rollout.samples_per_s"
"""Trajectories of one policy the last batch produced per second of that batch (trajectories/s),
labelled ``policy``, ``region``, ``hardware``. ``step``: the weight version that policy's engine holds."""

ROLLOUT_TRAJECTORIES = "rollout.trajectories"
"""Trajectories of one policy this producer process wrote so far (count, cumulative), labelled
``policy``, ``region``, ``hardware``. ``step``: the weight version that policy's engine holds."""

ROLLOUT_VERSION_LAG = "rollout.version_lag"
"""Newest weight version announced on the weights topic minus the version the engine generated the
batch with (versions), labelled ``policy``, ``region``, ``hardware``. ``step``: the engine's version."""

ROLLOUT_TURNS_GENERATED = "rollout.turns_generated"
"""Policy turns of multi-turn episodes this producer process generated so far (count, cumulative),
labelled ``policy``, ``region``, ``hardware``. ``step``: the weight version that policy's engine holds."""

ROLLOUT_TURNS_RESUMED = "rollout.turns_resumed"
"""Policy turns this producer process took from recorded episodes instead of generating them (count,
cumulative; ``producers/rollout/episode_journal.py``), labelled as ``rollout.turns_generated``."""

ROLLOUT_RESUMED_SECONDS = "rollout.resumed_seconds"
"""Generation and environment seconds of the turns this producer process took from recorded episodes,
which it did not spend again (seconds, cumulative), labelled as ``rollout.turns_generated``."""

ROLLOUT_EPISODES_RESUMED = "rollout.episodes_resumed"
"""Episodes this producer process resumed from their recorded turns (count, cumulative), labelled as
``rollout.turns_generated``."""

ROLLOUT_MEAN_REWARD = "rollout.mean_reward"
"""Mean reward of one policy's trajectories in the last batch (reward units; only for a batch with
some), labelled ``policy``, ``region``, ``hardware``. ``step``: the engine's weight version."""

# stream processors (streams/runtimes/processing.py, native.py, offline.py, faust_runtime.py); labelled ``policy``.
# ``step`` is the newest trainer weight version the processor has seen (at least 0).

STREAM_GROUP_REWARD = "stream.group_reward"
"""Mean reward of one completed group, accepted or dropped (reward units), one record per group.
``step``: the processor's trainer version."""

STREAM_STALENESS = "stream.staleness"
"""The processor's trainer version minus the oldest weight version a completed group's
trajectories were generated with (versions), one record per group. ``step``: the processor's trainer version."""

STREAM_ACCEPTED_GROUPS = "stream.accepted_groups"
"""Groups the pipeline's group operators accepted so far (count, cumulative in this process).
``step``: the processor's trainer version."""

STREAM_REPLAYED_GROUPS = "stream.replayed_groups"
"""Replayed copies of groups written to the samples topic so far (count, cumulative in this
process). ``step``: the processor's trainer version."""

STREAM_DROPPED_PREFIX = "stream.dropped."
"""Prefix of ``stream.dropped.<kind>``: groups dropped for one kind of reason so far (count,
cumulative in this process), the kind being the drop reason's first word (``stale``, ``zero_variance``,
``incomplete``, ``redelivered``, ...). ``step``: the processor's trainer version. Built by ``stream_dropped``."""

STREAM_OFFLINE_GROUPS = "stream.offline_groups"
"""Groups of an offline topic fed to the ``offline`` mixer so far (count, cumulative in this
process). ``step``: the processor's trainer version."""

STREAM_OFFLINE_DROPPED_PREFIX = "stream.offline_dropped."
"""Prefix of ``stream.offline_dropped.<kind>``: offline groups dropped for one kind of reason so far
(count, cumulative in this process). ``step``: the processor's trainer version. Built by
``stream_offline_dropped``."""

STREAM_OFFLINE_USED_UP = "stream.offline_used_up"
"""1.0 once a non-looping offline topic is read to its end and mixes in nothing more (flag).
``step``: the processor's trainer version."""

STREAM_FAUST_SKIPPED_RECORDS = "stream.faust_skipped_records"
"""Trajectory records the faust runtime left out and the processor read from the log instead (count,
cumulative in this process). ``step``: the processor's trainer version."""

STREAM_REWINDS = "stream.rewinds"
"""Transactions of the native runtime that the log aborted (a rebalance took partitions, the
embedded log stayed locked), after each of which the processor went back to its last commit and
read on from there (count, cumulative in this process). ``step``: the processor's trainer version."""

# trainer (consumers/trainer/component.py): ``train.<figure>`` for each figure of a step, labelled ``policy``.
# ``step`` is the weight version the optimizer step produced.

TRAIN_PREFIX = "train."
"""What every trainer metric name starts with. Built by ``train_metric``."""

TRAIN_VERSION = "train.version"
"""The trainer's weight version (version; value and ``step`` are both it): emitted once at start
(the restored or base version) and after every optimizer step."""

TRAIN_LOSS = "train.loss"
"""PPO-clip loss of the step's batch, with its KL term where ``train.kl`` has one, summed over its
micro-batches (dimensionless; 0 for the simulated backend). ``step``: the version the step produced."""

TRAIN_GRAD_NORM = "train.grad_norm"
"""Gradient norm of the step before clipping (dimensionless; 0 for the simulated backend).
``step``: the version the step produced."""

TRAIN_STEP_SECONDS = "train.step_seconds"
"""Wall time of the optimizer step (seconds). ``step``: the version the step produced."""

TRAIN_WAIT_SECONDS = "train.wait_seconds"
"""Time spent polling the samples topic since the previous step (seconds). ``step``: the version
the step produced."""

TRAIN_STALENESS_MAX = "train.staleness_max"
"""Largest trainer version before the step minus a batch sample's oldest generating version
(versions). ``step``: the version the step produced."""

TRAIN_SAMPLES = "train.samples"
"""Samples trained on so far, kept across restarts by the checkpoint (count, cumulative).
``step``: the version the step produced."""

TRAIN_WEIGHTS_BYTES = "train.weights_bytes"
"""Size of the payload published for the new version, delta or full (bytes). ``step``: the version
the step produced."""

TRAIN_WEIGHTS_CHANGED_FRACTION = "train.weights_changed_fraction"
"""Fraction of weight elements whose stored bits changed in that publish (0..1). ``step``: the
version the step produced."""

TRAIN_CLIP_FRACTION = "train.clip_fraction"
"""Token-weighted fraction of trained tokens whose clipped PPO branch was active (0..1).
``step``: the version the step produced."""

TRAIN_RATIO_MEAN = "train.ratio_mean"
"""Token-weighted mean of the ratio pi_theta / pi_old over trained tokens (dimensionless).
``step``: the version the step produced."""

TRAIN_IS_WEIGHT_MEAN = "train.is_weight_mean"
"""Token-weighted mean of the truncated importance weight (dimensionless). ``step``: the version
the step produced."""

TRAIN_TRUNCATED_FRACTION = "train.truncated_fraction"
"""Token-weighted fraction of trained tokens whose importance weight pi_old / pi_b was truncated
(0..1). ``step``: the version the step produced."""

TRAIN_BEHAVIOUR_KL = "train.behaviour_kl"
"""Token-weighted k3 estimate of KL(pi_b || pi_theta) against the behaviour policy (nats per token).
``step``: the version the step produced."""

TRAIN_KL = "train.kl"
"""Only with a KL term (``train.kl.coef`` above 0): token-weighted mean over the trained tokens of the
per-token estimate of KL(pi_theta || pi_ref) to the reference policy, by ``train.kl.estimator``
(nats per token). ``step``: the version the step produced."""

TRAIN_KL_COEF = "train.kl_coef"
"""Only with a KL term: the coefficient beta the step weighted it by (dimensionless; fixed, or moved
after each step by ``train.kl.adaptive``). ``step``: the version the step produced."""

TRAIN_SKIPPED_STEPS = "train.skipped_steps"
"""Optimizer steps skipped because their loss or gradient was not finite (count, cumulative in this
process); each skipped batch is dead-lettered and no version is published for it. ``step``: the
trainer's version, unchanged by the skipped step."""

TRAIN_STALE_SAMPLES = "train.stale_samples"
"""Samples the trainer consumed without training them because their group was generated more than
``max_staleness`` versions before the version being trained (count, cumulative in this process);
each such group is reported as dropped on the feedback topic. ``step``: the trainer's version."""

TRAIN_REJECTED_SAMPLES = "train.rejected_samples"
"""Samples the trainer dead-lettered instead of training (undecodable, or out of the model's range:
token ids, length, loss mask, advantage, group size), cumulative in this process (count). ``step``:
the trainer's version."""

TRAIN_SIMULATED_SECONDS = "train.simulated_seconds"
"""Only with ``train.backend: simulated``: the modelled duration of this step on the simulated
cluster, before ``time_scale`` (seconds). ``step``: the version the step produced."""

# evaluators (consumers/evaluators/policy.py, consumers/evaluators/system.py)

EVAL_ACCURACY = "eval.accuracy"
"""Held-out score of one weight version: greedy exact match (a judge policy: its verdicts' reward),
or for multi-turn workflows the mean episode reward (0..1 for 0/1 rewards), labelled ``policy``.
``step``: the version scored (0: the base checkpoint)."""

EVAL_SECONDS = "eval.seconds"
"""Wall time of that evaluation, weight loading included (seconds), labelled ``policy``.
``step``: the version scored."""

EVAL_SYSTEM_PREFIX = "eval.system."
"""Prefix of the system evaluator's figures of one (answer, judge) version pair, labelled
``versions`` (``name=version,name=version``). ``step``: the answer policy's version. Built by ``eval_system``."""

EVAL_SYSTEM_ALONE = "eval.system.alone"
"""Held-out accuracy of the answer policy's greedy answer by itself (0..1). ``step``: the answer
policy's version."""

EVAL_SYSTEM_JUDGED = "eval.system.judged"
"""Held-out accuracy of the system: the first of k candidates the judge accepts, else the greedy one
(0..1). ``step``: the answer policy's version."""

EVAL_SYSTEM_PASS_AT_K = "eval.system.pass_at_k"
"""Fraction of held-out prompts with a correct answer among the k candidates (0..1). ``step``: the
answer policy's version."""

EVAL_SYSTEM_JUDGE_ACCURACY = "eval.system.judge_accuracy"
"""Fraction of the judge's verdicts on candidates that were right (0..1). ``step``: the answer
policy's version."""

EVAL_SYSTEM_MAJORITY = "eval.system.majority"
"""Held-out accuracy of a majority vote over the same k candidates, no judge (0..1): the baseline the
judged figure must beat. ``step``: the answer policy's version."""

# scaler (scaler/component.py): ``step`` counts the scaler's decisions (1 for the first)

SCALER_WAIT_FRACTION = "scaler.wait_fraction"
"""Fraction of the trainer's time in the window spent waiting for samples (0..1; not written while
unknown). ``step``: the decision's number."""

SCALER_DESIRED_PRODUCERS = "scaler.desired_producers"
"""How many rollout producers the scaler wants (count; holds included), labelled ``rule``,
``reason``, ``bounds`` and every input of the decision. ``step``: the decision's number."""

# launcher (infra/launch/launcher.py)

LAUNCHER_RESTARTS = "launcher.restarts"
"""Restarts of one child process so far (count), one record per restart, labelled ``child``,
``kind`` and ``exit_code``. ``step``: the run's weight version as the run monitor saw it (the
slowest trainer's)."""


def train_metric(figure: str) -> str:
    """``train.<figure>``: the name of one of the trainer's per-step figures."""
    return TRAIN_PREFIX + figure


def stream_dropped(kind: str) -> str:
    """``stream.dropped.<kind>``: the stream processor's counter of groups dropped for ``kind``."""
    return STREAM_DROPPED_PREFIX + kind


def stream_offline_dropped(kind: str) -> str:
    """``stream.offline_dropped.<kind>``: the counter of offline groups dropped for ``kind``."""
    return STREAM_OFFLINE_DROPPED_PREFIX + kind


def eval_system(name: str) -> str:
    """``eval.system.<name>``: one figure of the system evaluator (a ``SystemAccuracy`` field)."""
    return EVAL_SYSTEM_PREFIX + name


_COUNTERS = frozenset(
    {
        FEEDER_SUBMITTED,
        FEEDER_SKIPPED,
        ROLLOUT_BUSY_SECONDS,
        ROLLOUT_TRAJECTORIES,
        ROLLOUT_TURNS_GENERATED,
        ROLLOUT_TURNS_RESUMED,
        ROLLOUT_EPISODES_RESUMED,
        ROLLOUT_RESUMED_SECONDS,
        STREAM_ACCEPTED_GROUPS,
        STREAM_REPLAYED_GROUPS,
        STREAM_OFFLINE_GROUPS,
        STREAM_FAUST_SKIPPED_RECORDS,
        STREAM_REWINDS,
        TRAIN_SAMPLES,
        TRAIN_SKIPPED_STEPS,
        TRAIN_STALE_SAMPLES,
        TRAIN_REJECTED_SAMPLES,
        LAUNCHER_RESTARTS,
    }
)
"""The names whose value is a cumulative count (of one emitting process, or kept across its restarts)."""

_COUNTER_PREFIXES = (STREAM_DROPPED_PREFIX, STREAM_OFFLINE_DROPPED_PREFIX)
"""Prefixes whose built names are all cumulative counts."""

_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_HISTOGRAMS: dict[str, tuple[float, ...]] = {
    STREAM_GROUP_REWARD: (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0),
    STREAM_STALENESS: (0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0),
    ROLLOUT_WEIGHTS_APPLIED_MS: (10.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0),
    TRAIN_STEP_SECONDS: _SECONDS_BUCKETS,
    TRAIN_WAIT_SECONDS: _SECONDS_BUCKETS,
    EVAL_SECONDS: _SECONDS_BUCKETS,
}
"""The names recorded once per event (a group, a weight version applied, a step, an evaluation),
with the upper bounds of their histogram buckets in the metric's unit; none is negative, as
Prometheus keeps no sum or count of a histogram with negative buckets (a negative reward falls in
the first bucket)."""


def kind(name: str) -> str:
    """``counter``, ``histogram`` or ``gauge``: how an exporter presents metric ``name``."""
    if name in _COUNTERS or name.startswith(_COUNTER_PREFIXES):
        return "counter"
    if name in _HISTOGRAMS:
        return "histogram"
    return "gauge"


def histogram_buckets(name: str) -> tuple[float, ...]:
    """The bucket upper bounds of a ``histogram`` name (``+Inf`` is implied)."""
    return _HISTOGRAMS[name]
