"""A trainer of several ranks, without starting any: each rank's share of a batch, its micro-batches,
the launcher command line, the config's checks, how a rank finds its start's store and how the
launcher's process ends."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest

from astraflow.config import parse_config
from astraflow.infra.launch.ranks import MAX_RESTARTS, RankLaunch, launcher_argv
from astraflow.training.distributed import TOKEN_KEY, Ranks, _join_store, _listening, share
from astraflow.training.step import PolicyExample, PolicyStepConfig, PolicyTrainer


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_shares_are_disjoint_contiguous_and_cover_the_batch(world_size: int) -> None:
    for count in range(0, 40):
        shares = [share(count, rank, world_size) for rank in range(world_size)]
        taken = [index for part in shares for index in part]
        assert taken == list(range(count))  # in the batch's order: disjoint, nothing skipped, nothing twice
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_rank_outside_the_world_has_no_share() -> None:
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        share(5, 2, 2)


class _NoBackend:
    """What ``PolicyTrainer`` needs of a backend to cut micro-batches (nothing is trained)."""

    optimizer = None


def _examples(count: int) -> list[PolicyExample]:
    return [
        PolicyExample(
            np.array([3, 4], np.int32),
            np.array([5, 6], np.int32),
            np.zeros(2, np.float32),
            np.ones(2, np.uint8),
            float(i),
        )
        for i in range(count)
    ]


@pytest.mark.parametrize(("count", "micro"), [(7, 2), (5, 2), (1, 2), (8, None), (3, None), (9, 4)])
def test_every_rank_runs_as_many_micro_batches_and_together_they_train_each_sample_once(count, micro) -> None:
    examples = _examples(count)
    parts = {
        rank: PolicyTrainer(
            None, 0, PolicyStepConfig(micro_batch_size=micro), backend=_NoBackend(), ranks=Ranks(rank, 2, rank)
        )._parts(examples)
        for rank in range(2)
    }
    assert len(parts[0]) == len(parts[1])  # FSDP2 gathers in every forward: the ranks must run alike
    trained = [
        example.advantage for rank in (0, 1) for part in parts[rank] for example in part if example.loss_mask.any()
    ]
    assert trained == [float(i) for i in range(count)]
    muted = [example for rank in (0, 1) for part in parts[rank] for example in part if not example.loss_mask.any()]
    assert all(example.advantage == 0.0 for example in muted)  # a rank with nothing left runs a zero-loss copy


def test_one_machine_uses_a_standalone_rendezvous() -> None:
    argv = launcher_argv(RankLaunch(nproc=2), ["train", "c.yaml", "--run-dir", "r"], python="py")
    assert argv == [
        "py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", str(MAX_RESTARTS),
        "--standalone", "-m", "astraflow.cli", "train", "c.yaml", "--run-dir", "r",
    ]  # fmt: skip


def test_ranks_run_the_command_without_the_launch_options() -> None:
    command = [
        "train",
        "c.yaml",
        "--nproc",
        "2",
        "--nnodes=2",
        "--node-rank",
        "0",
        "--rdzv-endpoint",
        "h:1",
        "--policy",
        "p",
    ]
    assert launcher_argv(RankLaunch(2, 2, 0, "h:1"), command, "py")[-5:] == [
        "astraflow.cli",
        "train",
        "c.yaml",
        "--policy",
        "p",
    ]


def test_machines_meet_at_the_endpoint() -> None:
    c10d = launcher_argv(RankLaunch(2, 2, rdzv_endpoint="10.0.0.1:29400", run_id="math.train.main"), ["train"], "py")
    assert c10d[c10d.index("--nnodes") :] == [
        "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv-id", "math.train.main",
        "-m", "astraflow.cli", "train",
    ]  # fmt: skip
    static = launcher_argv(RankLaunch(1, 2, node_rank=1, rdzv_endpoint="10.0.0.1:29400"), ["train"], "py")
    assert static[static.index("--nnodes") :][:8] == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static", "--rdzv-endpoint", "10.0.0.1:29400",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--rdzv-endpoint"):
        launcher_argv(RankLaunch(1, 2), ["train"])
    with pytest.raises(ValueError, match="--node-rank 2 is outside 0..1"):
        launcher_argv(RankLaunch(1, 2, node_rank=2, rdzv_endpoint="h:1"), ["train"])


def test_world_size_needs_a_backend_that_shards() -> None:
    assert parse_config({"train": {"world_size": 2, "backend": "fsdp"}}).train.world_size == 2
    assert parse_config({"train": {}}).train.world_size == 1
    assert parse_config({"train": {"world_size": 2, "backend": "deepspeed", "deepspeed": {"zero_stage": 3}}})
    with pytest.raises(Exception, match="world_size: 2 ranks of backend 'simulated'"):
        parse_config({"train": {"world_size": 2, "backend": "simulated"}})
    with pytest.raises(Exception, match="need train.deepspeed.zero_stage 1, 2 or 3"):
        parse_config({"train": {"world_size": 2, "backend": "deepspeed", "deepspeed": {"zero_stage": 0}}})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_rank_joins_only_the_store_that_left_its_token() -> None:
    import torch.distributed as dist

    own = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False)
    own.set(TOKEN_KEY, "this-start")
    joined = _join_store("127.0.0.1", own.port, "this-start", 2)
    assert joined is not None
    joined.set("seen", "yes")
    assert own.get("seen") == b"yes"
    # a store some other process listens with on the port a dead rank 0 had is not this start's
    assert _join_store("127.0.0.1", own.port, "a-previous-start", 2) is None


def test_a_port_nothing_listens_on_is_not_handed_to_the_store_client() -> None:
    port = _free_port()
    assert not _listening("127.0.0.1", port)
    assert _join_store("127.0.0.1", port, "any", 2) is None


def test_micro_batches_are_cut_from_the_share_ordered_by_length() -> None:
    lengths = [9, 2, 7, 3, 8, 1, 5, 4]
    examples = [
        PolicyExample(
            np.array([3], np.int32), np.full(n, 5, np.int32), np.zeros(n, np.float32), np.ones(n, np.uint8), float(i)
        )
        for i, n in enumerate(lengths)
    ]
    parts = PolicyTrainer(None, 0, PolicyStepConfig(micro_batch_size=3), backend=_NoBackend())._parts(examples)
    widths = [[len(example.response_ids) for example in part] for part in parts]
    assert widths == [[1, 2, 3], [4, 5, 7], [8, 9]]  # padded to 3, 7 and 9 rather than 9, 9 and 9
    unsplit = PolicyTrainer(None, 0, PolicyStepConfig(), backend=_NoBackend())._parts(examples)
    assert [example.advantage for example in unsplit[0]] == [float(i) for i in range(8)]  # one part keeps the order


def run_script(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by this Python in its own process, from the repository's root."""
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", script], cwd=repo, capture_output=True, text=True, timeout=120)


STOPPED_LAUNCHER = textwrap.dedent(
    """
    import signal, sys, threading, time
    from datetime import timedelta
    import torch.distributed as dist
    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from astraflow.infra.launch import ranks

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    other = dist.TCPStore("127.0.0.1", store.port, is_master=False)
    waiting = threading.Event()

    def heartbeat():  # as the rendezvous' keep-alive: a daemon thread inside a store call
        waiting.set()
        store.wait(["key"], timedelta(seconds=60))

    class AnswerWhileFinalising:  # the call returns while the interpreter finalises
        def __del__(self, other=other, sleep=time.sleep):
            other.set("key", b"1")
            sleep(2)

    def stopped(argv):  # torch.distributed.run's main, stopped by a signal
        threading.Thread(target=heartbeat, daemon=True).start()
        waiting.wait()
        sys.answer = AnswerWhileFinalising()
        raise SignalException("stop", signal.SIGTERM)

    torchrun.main = stopped
    ranks.run_launcher(ranks.RankLaunch(), ["train", "c.yaml"])
    """
)


def test_a_launcher_stopped_while_the_rendezvous_heartbeat_is_in_the_store_exits_0() -> None:
    """The two-machine trainer's agents aborted (SIGABRT) on a stop now and then: torch leaves the
    rendezvous heartbeat running after a stop signal, and its store call returned into the finalising
    interpreter. Here the call returns while the interpreter would finalise, every time."""
    done = run_script(STOPPED_LAUNCHER)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_launcher_whose_restarts_are_spent_exits_1_saying_so() -> None:
    script = textwrap.dedent(
        """
        import torch.distributed.run as torchrun
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from astraflow.infra.launch import ranks

        def failed(argv):
            raise ChildFailedError("astraflow.cli", {0: {"message": "rank 0 died", "timestamp": 0}})

        torchrun.main = failed
        ranks.run_launcher(ranks.RankLaunch(), ["train", "c.yaml"])
        """
    )
    done = run_script(script)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "the trainer's launcher failed" in done.stderr
