"""Two ranks train like one: DDP, FSDP2 and DeepSpeed ZeRO-3 on CPU (gloo), under PyTorch's own elastic launcher.

``tests/integration/learner_ranks.py`` runs as two ranks of ``torch.distributed.run``: the same tiny
model, five fixed batches (odd sizes, so the ranks' shares differ in length, and one batch of a
single sample, which leaves rank 1 with only a muted micro-batch), micro-batches of 2. Each rank
trains its own share of each batch; rank 0 writes the full weights as the trainer would publish
them. The reference is one process with the plain torch backend on whole batches.

Tolerance: max |w2 - w1| <= 1e-5 over every weight after five AdamW steps. Both sides compute in
fp32; they differ only in the order of the gradient sums (per rank, then all-reduced), about 1e-7
relative per step, and Adam's update is bounded by lr (1e-3), so rounding stays near 1e-7 (measured
1.2e-7); a wrong share, a sample trained twice or a wrong loss normalisation moves weights by ~lr.

With the KL term of ``learner_ranks.KL`` on (``train.kl``: a frozen reference each rank holds as it holds
the policy, re-synced half-way every two versions, an adaptive coefficient), FSDP2 ranks, whose
reference is sharded and synced shard by shard, and ZeRO-3 ranks, whose reference is an engine of its
own synced partition by partition, again train like one rank with the same term, within the same
tolerance, and report the same KL and coefficient; the term moves the weights by ~1e-3 against a run
without it, far beyond the tolerance. (DDP's reference is a whole copy on every rank, as one rank's is.)

ZeRO-3 also resumes under another world size through DeepSpeed's own checkpoints (converted to its
universal form on load): 2 ranks checkpoint after step 3, 1 rank resumes there and checkpoints after
step 4, 2 ranks resume there; each run's final weights match the reference within the same
tolerance, and the last checkpoint reads back as full weights in one process (``export-model``). A
lost Adam moment or step count, or a partition loaded into the wrong rank, moves weights by ~lr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest
import torch

from astraflow.training.distributed import SINGLE
from tests.integration.learner_ranks import train

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-5
"""fp32 max absolute weight difference allowed between 2 ranks and 1 (module docstring)."""


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, torch.Tensor], list[float], dict[str, torch.Tensor]]:
    """One rank, the plain torch backend: (weights after the five steps, [loss, norm, ...], initial weights)."""
    weights, figures, _ = train("torch", SINGLE)
    from tests.integration.learner_ranks import SPEC, build_char_tokenizer, build_tiny_model

    initial = build_tiny_model(build_char_tokenizer(), SPEC).state_dict()
    return weights, figures, initial


def two_ranks(backend: str, out: Path, *options: str | Path, nproc: int = 2) -> dict:
    """What rank 0 of a ``learner_ranks`` run of ``nproc`` ranks under ``torch.distributed.run`` wrote."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    command += ["-m", "tests.integration.learner_ranks", backend, str(out), *map(str, options)]
    # A session of its own: on a timeout the launcher and its ranks go together, none left running.
    session = {"start_new_session": True, "stdout": PIPE, "stderr": PIPE, "text": True}
    with subprocess.Popen(command, cwd=REPO, env=env, **session) as run:
        try:
            stdout, stderr = run.communicate(timeout=300)  # a hung rank exits at HANG_S with its stacks
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            stdout, stderr = run.communicate()
            raise AssertionError(f"ranks still running after 300 s:\n{stdout[-2000:]}{stderr[-8000:]}") from None
    assert run.returncode == 0, stdout[-2000:] + stderr[-8000:]
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("backend", ["torch", "fsdp"], ids=["ddp", "fsdp2"])
def test_two_ranks_train_like_one(reference, backend: str, tmp_path: Path) -> None:
    weights, figures, initial = reference
    got = two_ranks(backend, tmp_path / "rank0.pt")
    assert sorted(got["weights"]) == sorted(weights)
    difference = max(float((got["weights"][name] - tensor).abs().max()) for name, tensor in weights.items())
    assert difference <= TOLERANCE, difference
    moved = max(float((tensor - initial[name]).abs().max()) for name, tensor in weights.items())
    assert moved > 100 * TOLERANCE, moved  # the steps really changed the weights
    assert got["figures"] == pytest.approx(figures, rel=1e-5, abs=1e-6)  # each step's loss and gradient norm
    if backend == "fsdp":  # the checkpoint's full optimizer state, gathered from the shards
        state = got["optimizer"]["state"]
        assert state and all(float(entry["step"]) == 5 for entry in state.values())


@pytest.fixture(scope="module")
def kl_reference() -> tuple[dict[str, torch.Tensor], list[float]]:
    """One rank, the plain torch backend, with the KL term: (weights after the five steps, figures)."""
    weights, figures, _ = train("torch", SINGLE, kl=True)
    return weights, figures


@pytest.mark.parametrize("backend", ["fsdp", "deepspeed3"], ids=["fsdp2", "zero3"])
def test_two_ranks_with_a_kl_term_train_like_one(reference, kl_reference, backend: str, tmp_path: Path) -> None:
    if backend.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="needs deepspeed: scripts/setup.sh test deepspeed")
    weights, figures = kl_reference
    got = two_ranks(backend, tmp_path / "rank0.pt", "--kl")
    assert max_difference(got["weights"], weights) <= TOLERANCE
    assert got["figures"] == pytest.approx(figures, rel=1e-5, abs=1e-6)  # loss, norm, KL and β of each step
    assert max(figures[2::4]) > 1e-4 and figures[3::4] != [1.0] * 5  # the term was there, and β moved
    assert max_difference(weights, reference[0]) > 100 * TOLERANCE  # and it changed what was learned


def max_difference(got: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> float:
    assert sorted(got) == sorted(weights)
    return max(float((got[name] - tensor).abs().max()) for name, tensor in weights.items())


@pytest.fixture(scope="module")
def zero3(tmp_path_factory) -> tuple[Path, dict]:
    """Two ZeRO-3 ranks on the five batches, checkpointing after the third: (folder, what rank 0 wrote)."""
    pytest.importorskip("deepspeed", reason="needs deepspeed: scripts/setup.sh test deepspeed")
    root = tmp_path_factory.mktemp("zero3")
    return root, two_ranks("deepspeed3", root / "two.pt", "--save-after", 3, root / "two-ranks-v3")


def test_two_zero3_ranks_train_like_one(reference, zero3) -> None:
    weights, figures, initial = reference
    _, got = zero3
    assert max_difference(got["weights"], weights) <= TOLERANCE
    assert got["figures"] == pytest.approx(figures, rel=1e-5, abs=1e-6)


@pytest.mark.long  # three DeepSpeed launches, ~90 s; make test keeps the single-rank DeepSpeed checkpoint test
def test_zero3_resumes_two_ranks_to_one_and_one_to_two(reference, zero3) -> None:
    from astraflow.training.checkpoint import read_model_state

    weights, figures, _ = reference
    root, _ = zero3
    one = two_ranks(
        "deepspeed3",
        root / "one.pt",
        "--resume",
        root / "two-ranks-v3",
        "--save-after",
        4,
        root / "one-rank-v4",
        nproc=1,
    )
    assert max_difference(one["weights"], weights) <= TOLERANCE
    assert one["figures"] == pytest.approx(figures[6:], rel=1e-5, abs=1e-6)  # steps 4 and 5 only
    two = two_ranks(
        "deepspeed3", root / "two-again.pt", "--resume", root / "one-rank-v4", "--save-after", 5, root / "v5"
    )
    assert max_difference(two["weights"], weights) <= TOLERANCE
    assert two["figures"] == pytest.approx(figures[8:], rel=1e-5, abs=1e-6)
    assert max_difference(read_model_state(root / "v5"), weights) <= TOLERANCE  # export-model's reading
