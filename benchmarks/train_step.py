"""AstraFlow's train step against a bare PyTorch step on the same batch (issue #25), and what a KL term
to a reference policy adds to it (issue #55).

The batch is one step of the math example: 64 prompts x 8 responses sampled by the torch engine from
the warmed-up base (``astraflow warmup``'s cached checkpoint), with random ±1 advantages, written to
an ``.npz``. Then, in separate processes of ``--threads`` torch threads each, alternating which goes
first over ``--rounds`` rounds:

- ``bare``: ``benchmarks/bare_step.py``, a standalone script with no project imports (the reference);
- ``astraflow``: ``PolicyTrainer.step`` (``training/step.py``) with the math example's settings,
  the path the trainer takes for every version;
- ``astraflow_kl``: the same with ``train.kl`` on (``KL``: the base as reference, k3): one more
  forward pass per step, without gradients, through the frozen reference, and the term in the loss.

Each process times ``--reps`` steps after a warm-up step and reports the median; the result is the
median over rounds per side, and the ratios ``astraflow / bare`` and ``astraflow_kl / astraflow``.
The sides take turns going first. All sides' first losses must agree (same model, same batch, same
loss; the KL term is 0 at the first step, where the policy is its reference), else the script fails.

    .venv/bin/python benchmarks/train_step.py [--rounds 3] [--reps 10] [--threads 2]

Writes ``benchmarks/results/train_step.json`` (with its provenance: ``provenance.py``) and ``train_step.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
EXAMPLE = REPO / "examples" / "math" / "config.yaml"
SIDES = ("bare", "astraflow", "astraflow_kl")
KL = {"coef": 0.001, "estimator": "k3", "reference": "base"}
"""``train.kl`` of the ``astraflow_kl`` side: what it costs does not depend on the coefficient."""


def warmed_run_dir(work: Path) -> Path:
    """A run directory with the math example's warmed-up base (cached after the first ``astraflow warmup``)."""
    run_dir = work / "warm"
    astraflow = Path(sys.executable).with_name("astraflow")
    subprocess.run([str(astraflow), "warmup", str(EXAMPLE), "--run-dir", str(run_dir)], check=True, timeout=1800)
    return run_dir


def write_batch(run_dir: Path, out: Path, prompts: int = 64, group: int = 8, seed: int = 0) -> None:
    import random

    import numpy as np

    from astraflow.config import load_config
    from astraflow.engines.loading import load_policy
    from astraflow.engines.torch_engine import TorchEngine
    from astraflow.tasks.datasets import load_task_split

    config = load_config(EXAMPLE)
    model, tokenizer = load_policy(run_dir / "base")
    engine = TorchEngine(model, tokenizer, seed=seed)
    problems = random.Random(seed).sample(load_task_split(config.task, run_dir, "train"), prompts)
    groups = engine.generate(
        [problem.prompt for problem in problems],
        n=group,
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=1.0,
    )
    samples = [sample for batch in groups for sample in batch]
    rng = np.random.default_rng(seed)

    def padded(rows: list, dtype) -> np.ndarray:
        array = np.zeros((len(rows), max(len(row) for row in rows)), dtype=dtype)
        for index, row in enumerate(rows):
            array[index, : len(row)] = row
        return array

    np.savez(
        out,
        prompt_ids=padded([s.prompt_ids for s in samples], np.int32),
        prompt_lengths=np.array([len(s.prompt_ids) for s in samples]),
        response_ids=padded([s.response_ids for s in samples], np.int32),
        response_lengths=np.array([len(s.response_ids) for s in samples]),
        behaviour_logprobs=padded([s.logprobs for s in samples], np.float32),
        advantages=rng.choice([-1.0, 1.0], size=len(samples)).astype(np.float32),
    )


def astraflow_child(base: str, batch: str, threads: int, reps: int, kl: bool = False) -> dict:
    """In a process: the median seconds of ``PolicyTrainer.step`` on the batch (with ``kl``: the KL term of ``KL``)."""
    import numpy as np
    import torch

    from astraflow.config import load_config
    from astraflow.engines.loading import load_policy
    from astraflow.training.learner import build_learner, step_config
    from astraflow.training.step import PolicyExample

    torch.set_num_threads(threads)
    config = load_config(EXAMPLE, {"train.kl": KL} if kl else None)
    model, tokenizer = load_policy(base)
    learner = build_learner("torch", model, tokenizer.pad_token_id, step_config(config.train, config.rollout))
    data = np.load(batch)
    examples = [
        PolicyExample(
            data["prompt_ids"][row, : data["prompt_lengths"][row]],
            data["response_ids"][row, : data["response_lengths"][row]],
            data["behaviour_logprobs"][row, : data["response_lengths"][row]],
            np.ones(int(data["response_lengths"][row]), np.uint8),
            float(data["advantages"][row]),
        )
        for row in range(len(data["advantages"]))
    ]
    learner.config.lr_warmup_steps = 0  # the bare step runs at the peak lr from its first step
    first_loss = learner.step(examples).loss
    seconds = []
    for _ in range(reps):
        started = time.perf_counter()
        learner.step(examples)
        seconds.append(time.perf_counter() - started)
    return {"step_s": statistics.median(seconds), "first_loss": first_loss, "reps": reps}


def run_side(side: str, base: Path, batch: Path, threads: int, reps: int) -> dict:
    if side == "bare":
        command = [sys.executable, str(REPO / "benchmarks" / "bare_step.py"), "--model", str(base)]
        command += ["--batch", str(batch), "--threads", str(threads), "--reps", str(reps)]
    else:
        command = [sys.executable, __file__, "--child", str(base), str(batch), str(threads), str(reps), side]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    axis.bar(SIDES, [summary["median_step_s"][side] for side in SIDES], color=["#888", "#48c", "#c84"])
    axis.set_ylabel("seconds per step (median)")
    axis.set_title(
        f"512 sequences, tiny model: {summary['astraflow_over_bare']:.2f}x bare, "
        f"KL term {summary['kl_over_astraflow']:.2f}x"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        base, batch, threads, reps, side = args.child
        print(json.dumps(astraflow_child(base, batch, int(threads), int(reps), kl=side == "astraflow_kl")))
        return
    record = begin(EXAMPLE)
    with tempfile.TemporaryDirectory() as work:
        run_dir = warmed_run_dir(Path(work))
        base = run_dir / "base"
        batch = Path(work) / "batch.npz"
        write_batch(run_dir, batch)
        rounds: dict[str, list[dict]] = {side: [] for side in SIDES}
        for round_ in range(args.rounds):
            first = round_ % len(SIDES)
            for side in SIDES[first:] + SIDES[:first]:
                rounds[side].append(run_side(side, base, batch, args.threads, args.reps))
                print(f"round {round_} {side}: {rounds[side][-1]['step_s']:.4f} s", flush=True)
    losses = {side: rows[0]["first_loss"] for side, rows in rounds.items()}
    if any(abs(losses["bare"] - loss) > 1e-4 * max(1.0, abs(losses["bare"])) for loss in losses.values()):
        raise SystemExit(f"the sides computed different losses on the same batch: {losses}")
    median = {side: statistics.median(row["step_s"] for row in rows) for side, rows in rounds.items()}
    summary = {
        "median_step_s": median,
        "astraflow_over_bare": median["astraflow"] / median["bare"],
        "kl_over_astraflow": median["astraflow_kl"] / median["astraflow"],
        "losses": losses,
    }
    result = {
        "inputs": {
            "rounds": args.rounds,
            "reps": args.reps,
            "threads": args.threads,
            "batch": "64 x 8, math base",
            "kl": KL,
        },
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rounds": rounds,
        "summary": summary,
        "provenance": finish(record),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "train_step.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(summary, RESULTS / "train_step.png")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
