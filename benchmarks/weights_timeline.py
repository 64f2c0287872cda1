"""Where a streamed weight version's time goes, trainer and follower on one clock (a profiling aid).

``weights.py`` measures publish -> applied end to end; this prints the timeline behind it on the
same 494M Qwen2-shaped model, lr 1e-6, batch 2, sequence 64, the default ``WeightsConfig``: when
the trainer's encoding starts and ends, when the follower (its own process) receives and finishes
each chunk and the manifest, and when ``take`` hands the version out, plus, per version, how long
the follower spent applying chunks. Nothing is written to ``benchmarks/results``.

    .venv/bin/python benchmarks/weights_timeline.py [--steps 4] [--small]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

import torch

from astraflow.config import WeightsConfig
from astraflow.log import open_log
from astraflow.runtime.topics import RunTopics
from astraflow.schemas.codec import Codec


def stamp(events: list, what: str) -> None:
    events.append((time.time(), what))


def follower(target: dict, topic: str, versions: int, pipe) -> None:
    """A ``WeightFollower`` in its own process whose receiving and taking in are stamped."""
    from astraflow.weights import follow

    events: list = []
    receive, take_in = follow.WeightFollower._receive, follow.WeightFollower._take_in

    def stamped_receive(self, record, message) -> None:
        stamp(events, f"recv {record.kind} v{record.version} #{record.chunk_index}")
        receive(self, record, message)
        stamp(events, f"done {record.kind} v{record.version} #{record.chunk_index}")

    def stamped_take_in(self, *args) -> None:
        stamp(events, "take_in start")
        take_in(self, *args)
        stamp(events, "take_in end")

    follow.WeightFollower._receive, follow.WeightFollower._take_in = stamped_receive, stamped_take_in
    with open_log(**target) as log:
        weights = follow.WeightFollower(log, topic, payload=True, poll_timeout=0.05).start()
        pipe.send("ready")
        for version in range(versions):
            weights.wait_for(version, timeout=600)
            weights.take()
            stamp(events, f"taken v{version}")
            pipe.send(time.time())
            pipe.recv()
        weights.close()
    pipe.send(events)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    from astraflow.weights import streamed
    from astraflow.weights.publish import WeightPublisher
    from weights import adamw_step, build_model

    torch.set_num_threads(1)  # as weights.py: the trainer's default train.threads
    trainer: list = []
    stream_chunks = streamed.stream_chunks

    def stamped_stream_chunks(*args, **kwargs):
        stamp(trainer, "encode start")
        sent = stream_chunks(*args, **kwargs)
        stamp(trainer, f"encoded and sent ({sent.num_chunks} chunks)")
        return sent

    streamed.stream_chunks = stamped_stream_chunks
    model = build_model(args.small)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    work = Path(tempfile.mkdtemp(prefix="weights-timeline-"))
    target = {"backend": "embedded", "path": str(work / "log.sqlite")}
    try:
        with open_log(**target) as log, log.producer() as producer:
            topics = RunTopics("bench", "weights", ("main",))
            topics.ensure(log, partitions=1)
            topic = topics.weights("main")
            config = WeightsConfig(full_sync_interval=args.steps + 1)
            publisher = WeightPublisher(producer, Codec(), topic, "main", config, log=log)
            pipe, child = multiprocessing.Pipe()
            process = multiprocessing.get_context("spawn").Process(
                target=follower, args=(target, topic, args.steps + 1, child)
            )
            process.start()
            assert pipe.recv() == "ready"
            for version in range(args.steps + 1):
                if version:
                    adamw_step(model, optimizer, 2, 64, generator)
                stamp(trainer, f"publish v{version}")
                publisher.publish(model.state_dict(), version)
                stamp(trainer, f"published v{version}")
                trainer.append((pipe.recv(), f"applied v{version} (follower's clock)"))
                pipe.send("next")
            events = pipe.recv()
            process.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(trainer, events, args.steps)


def report(trainer: list, events: list, steps: int) -> None:
    timeline = sorted([(t, "trainer  " + w) for t, w in trainer] + [(t, "follower " + w) for t, w in events])
    for version in range(1, steps + 1):
        start = next(t for t, w in trainer if w == f"publish v{version}")
        end = next(t for t, w in trainer if w.startswith(f"applied v{version} "))
        print(f"-- version {version}")
        for t, what in timeline:
            chunk = "recv chunk" in what or "done chunk" in what
            if start <= t <= end and not chunk:
                print(f"{(t - start) * 1e3:8.1f} ms  {what}")
        received = [(t - start) * 1e3 for t, w in events if w.startswith(f"recv chunk v{version} ")]
        done = [(t - start) * 1e3 for t, w in events if w.startswith(f"done chunk v{version} ")]
        busy = sum(d - r for r, d in zip(received, done))
        print(
            f"   {len(received)} chunks: first received at {received[0]:.0f} ms, last at {received[-1]:.0f} ms, "
            f"last applied at {done[-1]:.0f} ms; the follower spent {busy:.0f} ms applying them"
        )


if __name__ == "__main__":
    main()
