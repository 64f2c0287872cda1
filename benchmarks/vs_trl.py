"""AstraFlow (the math example on the embedded log) vs TRL ``GRPOTrainer``: held-out exact match against wall time.

Both sides start from the same base checkpoint (``astraflow warmup CONFIG``, or ``--base``), train
on the same split of the run directory (``data/train.jsonl``), are scored by the same greedy
evaluator (``evaluate_exact_match``) on the same ``data/heldout.jsonl``, and sample the same
prompts x generations per rollout batch with the same lr, temperature, response length, clip
range, gradient clipping and AdamW betas. Each side runs in its own process tree, one after the
other (never together: they would share the 2 cores), alternating the order over ``--rounds``.

Both clocks start when this script launches the side's process, so each side's start-up
(imports, model loading, trainer construction, process spawning) is inside its time.

- AstraFlow: ``astraflow run CONFIG --run-dir DIR --no-dashboard --max-minutes N``; its curve is
  ``eval.accuracy`` of ``DIR/metrics.jsonl``, whose ``wall_s`` counts from the run monitor's start;
  the launch -> monitor offset (the launcher's start-up and cached warm-up check, seen as the
  moment ``metrics.jsonl`` appears) is added and reported. Its evaluator is a process of its own
  whose CPU time is part of the run: nothing is subtracted.
- TRL: this script with ``--child trl`` in a subprocess, ``torch.set_num_threads(--threads)``.
  Its clock *excludes* the held-out evaluations, which a ``TrainerCallback`` runs every
  ``--trl-eval-every`` steps; their time is reported apart.
- The compute bound of one 64x8 step (sample 512x4 tokens + one train step on 512 sequences) is
  measured in the same run by ``--child bound`` with AstraFlow's engine and ``PolicyTrainer``.

Known differences that stay (reported in the JSON under ``mismatches``): AstraFlow trains on
``train.batch_samples`` samples per version from groups with reward variance (DAPO dynamic
sampling) while TRL trains on all 512 samples of a step, zero-advantage groups included;
AstraFlow's samples may be up to ``stream.max_staleness`` versions old (decoupled PPO loss) while
TRL is on-policy; TRL samples with ``model.generate``, AstraFlow with its own KV-cache loop.

    .venv/bin/python benchmarks/vs_trl.py                              # default: 240 s per side
    .venv/bin/python benchmarks/vs_trl.py --max-seconds 40 --base benchmarks/results/prototype_grpo_base

Writes ``benchmarks/results/vs_trl.json`` (inputs, machine, per-round curves, medians, ratios,
provenance: ``provenance.py``) and
``vs_trl.png`` (held-out EM vs wall time, and vs samples trained).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from provenance import begin, finish

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PYTHON = sys.executable
PROMPT_IDS_CHECKED = 64
"""Prompts whose token ids, as TRL tokenizes them, are compared with the AstraFlow engine's."""


# ---------------------------------------------------------------------------------------------
# Curves


def first_reaching(curve: list[dict], threshold: float) -> float | None:
    """Wall seconds of the first of two consecutive evaluations at or above ``threshold`` (one lucky
    evaluation does not count); ``None`` if never."""
    return next((a["wall_s"] for a, b in zip(curve, curve[1:]) if a["em"] >= threshold and b["em"] >= threshold), None)


CHECKPOINTS_S = (60.0, 120.0, 180.0)
"""Wall times at which both sides' held-out EM is compared."""
BARS = {"time_to_threshold_ratio_min": 1.5, "per_version_over_bound_max": 1.3}
"""Issue #25: AstraFlow at least 1.5x sooner to the threshold, at most 1.3x the compute bound per version."""


def em_at(curve: list[dict], wall_s: float) -> float | None:
    """Held-out EM of the last evaluation at or before ``wall_s`` (a step function)."""
    known = [point["em"] for point in curve if point["wall_s"] <= wall_s]
    return known[-1] if known else None


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


# ---------------------------------------------------------------------------------------------
# CPU utilisation of a process tree


class TreeCpuSampler:
    """CPU seconds of a process and its descendants, sampled every ``interval`` seconds (psutil).

    A process's cumulative user+system time is kept from its last sample, so up to ``interval``
    seconds of CPU at the very end of a process's life are missed. Processes are named by the
    ``astraflow.cli`` subcommand they run (``train``, ``rollout`` ...), else by ``label``.
    """

    def __init__(self, pid: int, label: str, interval: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.label = label
        self.interval = interval
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _name(self, process: psutil.Process) -> str:
        argv = process.cmdline()
        if "astraflow.cli" in argv and argv.index("astraflow.cli") + 1 < len(argv):
            return argv[argv.index("astraflow.cli") + 1]
        return self.label

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for process in processes:
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        entry = self.seen.get(process.pid) or {
                            "name": self._name(process),
                            "created": process.create_time(),
                        }
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                entry["cpu_s"] = times.user + times.system
                entry["last_seen"] = time.time()
                self.seen[process.pid] = entry
            self._stop.wait(self.interval)

    def stop(self, wall_s: float) -> dict:
        """Per process name: count, CPU seconds, cores used while alive; and the tree's total."""
        self._stop.set()
        self._thread.join()
        by_name: dict[str, dict] = {}
        for entry in self.seen.values():
            row = by_name.setdefault(entry["name"], {"processes": 0, "cpu_s": 0.0, "alive_s": 0.0})
            row["processes"] += 1
            row["cpu_s"] += entry["cpu_s"]
            row["alive_s"] += max(entry["last_seen"] - entry["created"], 1e-6)
        for row in by_name.values():
            row["cores_while_alive"] = round(row["cpu_s"] / row["alive_s"], 3)
            row["cpu_s"], row["alive_s"] = round(row["cpu_s"], 2), round(row["alive_s"], 2)
        total = sum(row["cpu_s"] for row in by_name.values())
        return {
            "per_process": by_name,
            "total_cpu_s": round(total, 2),
            "wall_s": round(wall_s, 2),
            "cores_used": round(total / max(wall_s, 1e-6), 3),
        }


# ---------------------------------------------------------------------------------------------
# Child: the compute bound of one 64 x 8 step with AstraFlow's engine and PolicyTrainer


def bound_child(spec: dict) -> dict:
    """Median seconds to sample prompts x G x max_new_tokens and to train once on all of it."""
    import random

    import numpy as np
    import torch

    from astraflow.engines.loading import load_policy
    from astraflow.engines.torch_engine import TorchEngine
    from astraflow.tasks.base import read_jsonl
    from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer

    torch.set_num_threads(spec["threads"])
    model, tokenizer = load_policy(spec["base"])
    engine = TorchEngine(model, tokenizer, seed=spec["seed"])
    learner = PolicyTrainer(
        model, tokenizer.pad_token_id, PolicyStepConfig(lr=spec["lr"], temperature=spec["temperature"])
    )
    train = read_jsonl(spec["train"])
    rng = random.Random(spec["seed"])
    sample_s, train_s = [], []
    for rep in range(spec["reps"] + 1):  # the first repetition warms up allocators and is dropped
        prompts = [p.prompt for p in rng.sample(train, spec["prompts"])]
        started = time.perf_counter()
        groups = engine.generate(
            prompts, n=spec["group"], max_new_tokens=spec["max_new_tokens"], temperature=spec["temperature"]
        )
        sampled = time.perf_counter()
        examples = [
            PolicyExample(
                g.prompt_ids,
                g.response_ids,
                g.logprobs,
                np.ones(len(g.response_ids), np.uint8),
                rng.choice((-1.0, 1.0)),
            )
            for group in groups
            for g in group
        ]
        learner.step(examples)
        if rep:
            sample_s.append(sampled - started)
            train_s.append(time.perf_counter() - sampled)
    sample, step = statistics.median(sample_s), statistics.median(train_s)
    return {
        "threads": spec["threads"],
        "reps": spec["reps"],
        "sample_s": round(sample, 4),
        "train_step_s": round(step, 4),
        "step_s": round(sample + step, 4),
        "sequences": spec["prompts"] * spec["group"],
    }


# ---------------------------------------------------------------------------------------------
# Child: TRL GRPOTrainer with a held-out clock


def trl_child(spec: dict) -> dict:
    """Train with TRL until held-out EM reaches ``stop_at`` or the (eval-free) clock ``max_seconds``."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from astraflow.engines.loading import load_policy
    from astraflow.episodes.heldout import evaluate_exact_match
    from astraflow.tasks.arithmetic import exact_match_reward
    from astraflow.tasks.base import read_jsonl

    torch.set_num_threads(spec["threads"])
    launched = spec["launched_epoch"]
    model, tokenizer = load_policy(spec["base"])
    model.train()
    train, heldout = read_jsonl(spec["train"]), read_jsonl(spec["heldout"])
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in train])

    def exact_match(completions: list[str], answer: list[str], **_: object) -> list[float]:
        return [exact_match_reward(text, reference) for text, reference in zip(completions, answer, strict=True)]

    class HeldoutClock(TrainerCallback):
        """Held-out EM every ``eval_every`` steps on a clock that leaves evaluation time out."""

        def __init__(self) -> None:
            self.eval_s = self.eval_cpu_s = 0.0
            self.curve: list[dict] = []
            self.step_ends: list[float] = []
            self.train_began = 0.0

        def clock(self) -> float:
            return time.time() - launched - self.eval_s

        def _evaluate(self, step: int, model: torch.nn.Module) -> float:
            wall, started, cpu = self.clock(), time.time(), time.process_time()
            em = evaluate_exact_match(model, tokenizer, heldout, max_new_tokens=spec["max_new_tokens"])
            self.eval_s += time.time() - started
            self.eval_cpu_s += time.process_time() - cpu
            self.curve.append(
                {"step": step, "wall_s": round(wall, 3), "samples": step * spec["prompts"] * spec["group"], "em": em}
            )
            print(f"  trl step {step:4d}  {wall:6.1f}s  EM {em:.3f}", flush=True)
            return em

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.train_began = self.clock()
            self._evaluate(0, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self.step_ends.append(self.clock())
            out_of_time = self.clock() >= spec["max_seconds"]
            if state.global_step % spec["eval_every"] == 0 or out_of_time:
                if self._evaluate(state.global_step, model) >= spec["stop_at"] or out_of_time:
                    control.should_training_stop = True

    config = GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_vllm=False,
        beta=0.0,
        num_generations=spec["group"],
        per_device_train_batch_size=spec["prompts"] * spec["group"],
        gradient_accumulation_steps=1,
        max_completion_length=spec["max_new_tokens"],
        temperature=spec["temperature"],
        learning_rate=spec["lr"],
        # AstraFlow's schedule (train.lr_warmup_versions, lr_decay_versions, min_lr_ratio): linear
        # warm-up, then cosine to the floor over decay steps (max_steps ends it; the clock stops first)
        lr_scheduler_type="cosine_with_min_lr" if spec["decay_steps"] else "constant_with_warmup",
        lr_scheduler_kwargs={"min_lr_rate": spec["min_lr_ratio"]} if spec["decay_steps"] else None,
        warmup_steps=spec["warmup_steps"],
        adam_beta1=spec["betas"][0],
        adam_beta2=spec["betas"][1],
        weight_decay=spec["weight_decay"],
        max_grad_norm=spec["max_grad_norm"],
        epsilon=spec["clip_low"],
        epsilon_high=spec["clip_high"],
        max_steps=spec["warmup_steps"] + spec["decay_steps"] if spec["decay_steps"] else 1_000_000,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=spec["seed"],
    )
    clock = HeldoutClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact_match,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    prompts = [p.prompt for p in train[:PROMPT_IDS_CHECKED]]
    trl_ids = [list(ids) for ids in trainer._tokenize_prompts(prompts)[0]]
    engine_ids = [list(ids) for ids in tokenizer(prompts)["input_ids"]]  # what TorchEngine.generate feeds the model
    cpu_started = time.process_time()
    trainer.train()
    cpu_s = time.process_time() - cpu_started - clock.eval_cpu_s
    train_wall = clock.clock() - clock.train_began
    steps = [b - a for a, b in zip([clock.train_began, *clock.step_ends], clock.step_ends)]
    return {
        "curve": clock.curve,
        "setup_s": round(clock.train_began, 3),
        "eval_seconds": round(clock.eval_s, 3),
        "steps": len(clock.step_ends),
        "seconds_per_step": median_or_none(steps[1:]),
        "first_step_s": steps[0] if steps else None,
        "train_cpu_s_excluding_eval": round(cpu_s, 2),
        "train_cores_used_excluding_eval": round(cpu_s / max(train_wall, 1e-6), 3),
        "samples_per_step": spec["prompts"] * spec["group"],
        "trained_samples_per_s": spec["prompts"] * spec["group"] / statistics.median(steps[1:]) if steps[1:] else None,
        "prompt_ids_match_engine": trl_ids == engine_ids,
        "prompt_ids_example": {"text": prompts[0], "trl": trl_ids[0], "engine": engine_ids[0]},
        "torch_threads": torch.get_num_threads(),
        "grpo_config": {key: getattr(config, key) for key in spec["reported_fields"]},
        "log_history": [entry for entry in trainer.state.log_history if "reward" in entry],
    }


def run_child(kind: str, spec: dict, work: Path) -> tuple[dict, dict]:
    """Run ``--child kind`` in a subprocess; returns its result and its CPU use."""
    spec_path, out_path = work / f"{kind}.spec.json", work / f"{kind}.out.json"
    spec = {**spec, "launched_epoch": time.time()}
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"]), "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    with (work / f"{kind}.log").open("w") as log:
        process = subprocess.Popen(
            [PYTHON, __file__, "--child", kind, str(spec_path), str(out_path)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        sampler = TreeCpuSampler(process.pid, kind)
        code = process.wait()
    cpu = sampler.stop(time.monotonic() - started)
    if code != 0:
        raise RuntimeError(f"--child {kind} failed with exit code {code}; see {work / f'{kind}.log'}")
    return json.loads(out_path.read_text()), cpu


# ---------------------------------------------------------------------------------------------
# AstraFlow side


def run_astraflow(config_path: Path, run_dir: Path, prepared: Path, max_seconds: float) -> dict:
    """``astraflow run`` on a fresh run dir seeded with the shared base and split; its curve and CPU."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    shutil.copytree(prepared / "base", run_dir / "base")
    shutil.copytree(prepared / "data", run_dir / "data")
    argv = [
        PYTHON,
        "-m",
        "astraflow.cli",
        "run",
        str(config_path),
        "--run-dir",
        str(run_dir),
        "--no-dashboard",
        "--max-minutes",
        str(max_seconds / 60),
    ]
    started = time.monotonic()
    with (run_dir / "run.out").open("w") as out:
        process = subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        sampler = TreeCpuSampler(process.pid, "run")
        while not (run_dir / "metrics.jsonl").exists() and process.poll() is None:
            time.sleep(0.05)  # the run monitor creates metrics.jsonl when its clock (wall_s = 0) starts
        monitor_offset = time.monotonic() - started
        try:
            code = process.wait(timeout=max(1.0, max_seconds + 180 - monitor_offset))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)  # the launcher stops its components and writes the summary
            try:
                code = process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                code = process.wait()
    cpu = sampler.stop(time.monotonic() - started)
    if code != 0 or not (run_dir / "summary.json").is_file():
        raise RuntimeError(
            f"astraflow run failed with exit code {code}; see {run_dir / 'run.out'} and {run_dir / 'logs'}"
        )
    return {**read_astraflow_run(run_dir, monitor_offset), "cpu": cpu}


def read_astraflow_run(run_dir: Path, monitor_offset: float) -> dict:
    """Curve and rates of a finished run from its metrics.jsonl and summary.json, on the launch clock."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    samples = {row["step"]: row["value"] for row in rows if row["name"] == "train.samples"} | {0: 0}
    curve = [
        {
            "step": row["step"],
            "wall_s": round(row["wall_s"] + monitor_offset, 3),
            "monitor_wall_s": row["wall_s"],
            "samples": samples.get(row["step"]),
            "em": row["value"],
        }
        for row in sorted((r for r in rows if r["name"] == "eval.accuracy"), key=lambda r: r["wall_s"])
    ]
    published = sorted(
        (row["wall_s"] + monitor_offset, int(row["value"]))
        for row in rows
        if row["name"] == "train.version" and row["value"] > 0
    )
    seconds_per_version = trained_per_s = None
    if len(published) >= 2:
        (t0, v0), (t1, v1) = published[0], published[-1]
        seconds_per_version = (t1 - t0) / max(v1 - v0, 1)
        trained_per_s = (samples.get(v1, 0) - samples.get(v0, 0)) / max(t1 - t0, 1e-6)
    step_seconds = [row["value"] for row in rows if row["name"] == "train.step_seconds"]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "curve": curve,
        "monitor_start_after_launch_s": round(monitor_offset, 3),
        "first_version_s": round(published[0][0], 3) if published else None,
        "versions": summary["versions"],
        "seconds_per_version": seconds_per_version,
        "trained_samples_per_s": trained_per_s,
        "train_step_seconds_median": median_or_none(step_seconds),
        "trained_samples": max(samples.values(), default=0),
        "generated_trajectories": summary["trajectories"],
        "dropped": {row["name"]: row["value"] for row in rows if row["name"].startswith("stream.dropped.")},
        "summary": summary,
    }


# ---------------------------------------------------------------------------------------------
# Orchestration


BASE_EVAL_EVERY = 1  # warm-up steps between held-out checks: the base stops at the first step reaching --base-accuracy


def prepare(args: argparse.Namespace, work: Path):
    """The benchmark's config (stop rule overridden) and a run dir holding the shared base and split."""
    from astraflow.config import dump_config, load_config
    from astraflow.tasks.datasets import load_task_split

    config = load_config(args.config, {"stop.target_accuracy": args.stop_at, "stop.max_minutes": args.max_seconds / 60})
    config_path = work / "astraflow.yaml"
    dump_config(config, config_path)
    prepared = work / "prepared"
    if args.base:
        shutil.copytree(args.base, prepared / "base")
    else:
        # the base of the committed a8c69cf comparison held 0.38 out; the example's own warm-up (target 0.30,
        # checked every 25 steps) overshoots to ~0.5 in its steepest stretch, so the benchmark warms up to
        # --base-accuracy, checked every step, in a config of its own (the run itself loads this base)
        warmup_path = work / "warmup.yaml"
        dump_config(
            load_config(
                args.config, {"warmup.target_accuracy": args.base_accuracy, "warmup.eval_every": BASE_EVAL_EVERY}
            ),
            warmup_path,
        )
        subprocess.run(
            [PYTHON, "-m", "astraflow.cli", "warmup", str(warmup_path), "--run-dir", str(prepared)],
            cwd=REPO,
            check=True,
        )
    load_task_split(config.task, prepared, "train")  # writes data/{train,heldout}.jsonl if absent
    return config, config_path, prepared


def compare(astraflow: dict, trl: dict, threshold: float) -> dict:
    """Time to ``threshold`` per side, their ratio, and both accuracies at the shorter side's end."""
    a_curve, t_curve = astraflow["curve"], trl["curve"]
    a_time, t_time = first_reaching(a_curve, threshold), first_reaching(t_curve, threshold)
    a_end, t_end = (a_curve[-1]["wall_s"] if a_curve else 0.0), (t_curve[-1]["wall_s"] if t_curve else 0.0)
    equal = min(a_end, t_end)
    bound = None  # when one side missed the threshold, its last evaluation bounds the ratio
    if a_time and not t_time and t_end:
        bound = {"at_least": round(t_end / a_time, 3)}
    elif t_time and not a_time and a_end:
        bound = {"at_most": round(t_time / a_end, 3)}
    return {
        "astraflow_time_to_threshold_s": a_time,
        "trl_time_to_threshold_s": t_time,
        "trl_over_astraflow_time_to_threshold": round(t_time / a_time, 3) if a_time and t_time else None,
        "trl_over_astraflow_bound": bound,
        "equal_wall_s": equal,
        "astraflow_em_at_equal_wall": em_at(a_curve, equal),
        "trl_em_at_equal_wall": em_at(t_curve, equal),
        "astraflow_final_em": a_curve[-1]["em"] if a_curve else None,
        "trl_final_em": t_curve[-1]["em"] if t_curve else None,
        **{f"astraflow_em_at_{at:.0f}s": em_at(a_curve, at) for at in CHECKPOINTS_S},
        **{f"trl_em_at_{at:.0f}s": em_at(t_curve, at) for at in CHECKPOINTS_S},
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_samples) = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = {"astraflow": "tab:blue", "trl": "tab:orange"}
    for index, round_ in enumerate(report["rounds"]):
        for side, colour in colours.items():
            curve = round_[side]["curve"]
            label = f"{side} (round {index})" if len(report["rounds"]) > 1 else side
            by_time.step(
                [p["wall_s"] for p in curve],
                [p["em"] for p in curve],
                where="post",
                color=colour,
                alpha=0.9 - 0.2 * index,
                marker="o",
                ms=2,
                label=label,
            )
            points = [p for p in curve if p["samples"] is not None]
            by_samples.plot(
                [p["samples"] for p in points],
                [p["em"] for p in points],
                color=colour,
                alpha=0.9 - 0.2 * index,
                marker="o",
                ms=2,
                label=label,
            )
    threshold = report["inputs"]["threshold"]
    for axis, x_label in (
        (by_time, "wall seconds (TRL: evaluation excluded)"),
        (by_samples, "samples in optimizer steps"),
    ):
        axis.axhline(threshold, color="grey", ls="--", lw=1)
        axis.set_xlabel(x_label)
        axis.set_ylabel("held-out exact match")
        axis.set_ylim(0, 1.02)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right")
    ratio = report["medians"]["trl_over_astraflow_time_to_threshold"]
    fig.suptitle(
        f"AstraFlow vs TRL GRPOTrainer, {report['inputs']['prompts']}x{report['inputs']['group']} per step, "
        f"lr {report['inputs']['lr']}"
        f" - time to {threshold:.0%}: TRL/AstraFlow = {ratio if ratio is not None else 'n/a'}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "math" / "config.yaml")
    parser.add_argument(
        "--base", type=Path, help="use this checkpoint instead of `astraflow warmup CONFIG` (development)"
    )
    parser.add_argument(
        "--base-accuracy",
        type=float,
        default=0.38,
        help="held-out EM the shared base is warmed up to (0.38: the base of the committed a8c69cf comparison)",
    )
    parser.add_argument("--max-seconds", type=float, default=240.0, help="wall budget of each side")
    parser.add_argument("--threshold", type=float, default=0.85, help="held-out EM whose time is compared")
    parser.add_argument("--stop-at", type=float, default=0.90, help="each side stops at this held-out EM")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of both sides, order alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the TRL process and the compute bound")
    parser.add_argument("--trl-eval-every", type=int, default=5, help="TRL steps between held-out evaluations")
    parser.add_argument("--bound-reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "vs_trl", help="scratch directory (emptied)")
    parser.add_argument("--output", type=Path, default=RESULTS / "vs_trl.json")
    args = parser.parse_args()

    record = begin(args.config)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    load_start = os.getloadavg()
    config, config_path, prepared = prepare(args, args.work)
    t = config.train
    base = prepared / "base"
    shared = {
        "base": str(base),
        "train": str(prepared / "data" / "train.jsonl"),
        "heldout": str(prepared / "data" / "heldout.jsonl"),
        "lr": t.lr,
        "prompts": config.train.batch_samples // config.rollout.group_size,  # one batch: 64 x 8 as at a8c69cf
        "group": config.rollout.group_size,
        "temperature": config.rollout.temperature,
        "max_new_tokens": config.rollout.max_new_tokens,
        "threads": args.threads,
        "seed": args.seed,
    }
    from astraflow.training.step import PolicyStepConfig

    trl_spec = {
        **shared,
        "max_seconds": args.max_seconds,
        "stop_at": args.stop_at,
        "eval_every": args.trl_eval_every,
        "betas": list(PolicyStepConfig.betas),
        "weight_decay": t.weight_decay,
        "warmup_steps": t.lr_warmup_versions,
        "decay_steps": t.lr_decay_versions,
        "min_lr_ratio": t.min_lr_ratio,
        "max_grad_norm": t.max_grad_norm,
        "clip_low": t.clip_low,
        "clip_high": t.clip_high,
        "output_dir": str(args.work / "trl"),
        "reported_fields": [
            "use_cpu",
            "bf16",
            "gradient_checkpointing",
            "use_vllm",
            "beta",
            "num_generations",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "generation_batch_size",
            "steps_per_generation",
            "num_iterations",
            "max_completion_length",
            "temperature",
            "top_p",
            "top_k",
            "learning_rate",
            "lr_scheduler_type",
            "adam_beta1",
            "adam_beta2",
            "weight_decay",
            "max_grad_norm",
            "epsilon",
            "epsilon_high",
            "loss_type",
            "scale_rewards",
            "seed",
        ],
    }
    print(f"compute bound ({args.threads} threads) ...", flush=True)
    bound, _ = run_child("bound", {**shared, "reps": args.bound_reps}, args.work)
    print(
        f"  sample {bound['sample_s']:.3f}s + train {bound['train_step_s']:.3f}s = {bound['step_s']:.3f}s", flush=True
    )
    rounds = []
    for index in range(args.rounds):
        round_: dict = {"order": ["astraflow", "trl"] if index % 2 == 0 else ["trl", "astraflow"]}
        for side in round_["order"]:
            round_[f"loadavg_before_{side}"] = os.getloadavg()
            print(f"round {index}: {side} ...", flush=True)
            if side == "astraflow":
                round_[side] = run_astraflow(config_path, args.work / f"astraflow-{index}", prepared, args.max_seconds)
            else:
                result, cpu = run_child("trl", trl_spec, args.work)
                round_[side] = {**result, "cpu": cpu}
            round_[f"loadavg_after_{side}"] = os.getloadavg()  # other jobs on a shared machine skew a side
            curve = round_[side]["curve"]
            ems = " -> ".join(f"{point['em']:.3f}" for point in curve[:: max(1, len(curve) - 1)])
            print(f"  {side}: EM {ems or 'never evaluated'} at {curve[-1]['wall_s'] if curve else 0:.1f}s", flush=True)
        round_["comparison"] = compare(round_["astraflow"], round_["trl"], args.threshold)
        rounds.append(round_)

    def median_of(key: str) -> float | None:
        return median_or_none([r["comparison"][key] for r in rounds if r["comparison"][key] is not None])

    medians = {key: median_of(key) for key in rounds[0]["comparison"] if key != "trl_over_astraflow_bound"}
    medians["astraflow_seconds_per_version"] = median_or_none(
        [r["astraflow"]["seconds_per_version"] for r in rounds if r["astraflow"]["seconds_per_version"]]
    )
    medians["trl_seconds_per_step"] = median_or_none(
        [r["trl"]["seconds_per_step"] for r in rounds if r["trl"]["seconds_per_step"]]
    )
    for side, key in (("astraflow", "astraflow_seconds_per_version"), ("trl", "trl_seconds_per_step")):
        medians[f"{side}_per_step_over_compute_bound"] = (
            round(medians[key] / bound["step_s"], 3) if medians[key] else None
        )
        medians[f"{side}_trained_samples_per_s"] = median_or_none(
            [r[side]["trained_samples_per_s"] for r in rounds if r[side]["trained_samples_per_s"]]
        )
    medians["compute_bound_samples_per_s"] = round(bound["sequences"] / bound["step_s"], 1)
    ratio, per_version = (
        medians["trl_over_astraflow_time_to_threshold"],
        medians["astraflow_per_step_over_compute_bound"],
    )
    medians["bars"] = BARS
    medians["bars_met"] = {
        "time_to_threshold": ratio is not None and ratio >= BARS["time_to_threshold_ratio_min"],
        "em_at_checkpoints": all(
            medians[f"astraflow_em_at_{at:.0f}s"] is not None
            and medians[f"astraflow_em_at_{at:.0f}s"] >= (medians[f"trl_em_at_{at:.0f}s"] or 0.0)
            for at in CHECKPOINTS_S
        ),
        "per_version_over_bound": per_version is not None and per_version <= BARS["per_version_over_bound_max"],
    }
    report = {
        "inputs": {
            "config": str(args.config),
            "base": str(args.base or "astraflow warmup"),
            "base_target_accuracy": None if args.base else args.base_accuracy,
            "threshold": args.threshold,
            "stop_at": args.stop_at,
            "max_seconds_per_side": args.max_seconds,
            "rounds": args.rounds,
            "lr": t.lr,
            "prompts": shared["prompts"],
            "group": shared["group"],
            "temperature": shared["temperature"],
            "max_new_tokens": shared["max_new_tokens"],
            "trl_threads": args.threads,
            "trl_eval_every": args.trl_eval_every,
            "heldout_size": len((prepared / "data" / "heldout.jsonl").read_text().splitlines()),
            "base_sha256": hashlib.sha256((base / "model.safetensors").read_bytes()).hexdigest(),
            "astraflow_config": config.model_dump(mode="json"),
            "astraflow_samples_per_version": t.batch_samples,
            "trl_samples_per_step": shared["prompts"] * shared["group"],
        },
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "versions": {name: _version(name) for name in ("torch", "transformers", "trl", "datasets")},
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
        },
        "compute_bound": bound,
        "mismatches": [
            f"samples per optimizer step: AstraFlow {t.batch_samples} "
            "(train.batch_samples, groups with reward variance only), "
            f"TRL {shared['prompts'] * shared['group']} (all groups, zero-advantage ones included)",
            f"AstraFlow trains on samples up to stream.max_staleness={config.stream.max_staleness} versions old; "
            "TRL is on-policy",
            "held-out evaluation: excluded from the TRL clock; "
            "AstraFlow's evaluator process shares the cores during the run",
            f"evaluation cadence: TRL every {args.trl_eval_every} steps, "
            f"AstraFlow every {config.eval.every_versions} versions "
            "(the newest version when the evaluator is behind): "
            "times to threshold are rounded up to the next evaluation",
            f"threads: TRL one process with {args.threads}; "
            f"AstraFlow rollout {config.rollout.threads} x {config.rollout.producers}, "
            f"train {t.threads}, eval {config.eval.threads} (plus feeder and stream processor)",
            "loss: both token-mean PPO-clip (TRL loss_type 'dapo'), "
            "but TRL's mean runs over all 512 responses (zero-advantage "
            "ones dilute it) and AstraFlow's over its kept samples; GRPO std epsilon TRL 1e-4, AstraFlow 1e-6",
            "sampling: TRL model.generate, AstraFlow its KV-cache loop (same token ids, temperature, max length)",
        ],
        "medians": medians,
        "rounds": rounds,
        "provenance": finish(record),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1, default=str))
    plot(report, args.output.with_suffix(".png"))
    print(json.dumps(medians, indent=1))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        kind, spec_file, out_file = sys.argv[2:]
        child = {"bound": bound_child, "trl": trl_child}[kind]
        Path(out_file).write_text(json.dumps(child(json.loads(Path(spec_file).read_text())), default=str))
    else:
        main()
