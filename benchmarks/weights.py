"""Weight versions on the log: sparse bf16 deltas against full versions, on a Qwen2-0.5B-shaped model.

What it measures (issue #5), on a randomly initialised Qwen2 (hidden 896, 24 layers, 14 heads,
2 kv heads, intermediate 4864, vocab 151936, tied embeddings: 494M parameters, fp32, CPU) that
takes ``--steps`` AdamW steps (lr 1e-6) on real gradients of small random-token batches:

1. Size: per step, the fraction of bf16 elements whose bits changed, the delta's bytes against
   the full bf16 version's bytes, and two entropy bounds. ``global``/``per_tensor`` (the issue's):
   ``n·H(k/n) + 16·k`` bits, positions plus 16 bits per changed value, over all elements or summed
   per tensor. Our deltas code values as 4-bit differences of the bit patterns (``delta.py``), so
   they beat that "bound"; the tighter ``with_differences`` bound charges each changed value the
   measured entropy of those differences instead of 16 bits. Plain ``uint32`` indices and
   bitmap + values are shown for reference. Target: our ratio >= 80% of the issue's bound.
2. Speed, in *model bytes* (the full bf16 version's size) per second, through the embedded log:
   ``encode`` (fp32 → bf16 copy + delta), ``publish`` (steps 3-4: sha256, chunks, send, flush),
   ``fetch`` (read and decode the records), ``assemble`` (join chunks, sha256), ``apply`` (check
   every section, then write the delta into the reader's bf16 state in place: the ``take`` of a
   ``WeightFollower`` in its own process, or the same apply onto the previous version held here,
   whichever was faster), against a plain in-memory copy of the same number of bytes, measured
   next to each version. Target: publish + apply >= 30% of the copy rate;
   ``end_to_end`` also counts encode, fetch and assemble. ``store_publish``/``store_fetch`` are
   the same payload through ``weights.transport: store`` (chunks to a directory, the manifest on
   the log; fetch = read the files + sha256). The machine is shared, so ``publish`` and
   ``store_publish`` are the best of ``--repeats`` runs (the real publish, then replays of its
   steps 3-4 on a scratch topic). ``publish_to_applied_ms`` is the wall time from the start of
   ``publish`` to the follower process handing the version out (what producers report as
   ``rollout.weights_applied_ms``); the other reader stages run after it, not competing with it.
3. End to end, per publish path (``--coders``, taking turns by version, so both run on the same
   machine at the same time): ``end_to_end`` is the p50 and p99 over the deltas of
   ``publish_to_applied_ms``, wall-clock from "the trainer has the new weights" (the optimizer step
   returned) to "the follower, in its own process, has them applied" (``take`` returned), not a sum
   of stage times. ``serial``: encode everything, then hash and send (``weights.encode_workers: 0``);
   ``streamed``: tensors encoded on every core while the chunks before them go out, and the follower
   writes them into its shadow as they arrive. ``follower_shadow_bytes`` is the shadow's memory (one
   more copy of the weights in the transfer dtype), ``follower_applied_ahead`` the versions it took so.
   A coder named with ``-plain`` (``streamed-plain``, ``serial-plain``) publishes without entropy coding
   (``weights.entropy_coding: false``), so its cost and gain are measured side by side; one with
   ``-numpy`` (``streamed-numpy``) casts and finds the changes with numpy's three passes instead of the
   C kernel (``weights.compiled_encode: false``).
4. Entropy coding: every delta is also encoded the other way, outside the timed path, so each version's
   size is known with entropy coding (``delta_bytes``, the default) and without (``plain_delta_bytes``)
   whichever coder published it.

Writes ``benchmarks/results/weights.json`` (with its provenance: ``provenance.py``) and ``.png``.

    .venv/bin/python benchmarks/weights.py [--small] [--steps 3] [--threads N] [--repeats 3] [--coders streamed,serial]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from astraflow.config import WeightsConfig
from astraflow.engines.shapes import QWEN2_05B
from astraflow.log import TopicPartition, open_log
from astraflow.runtime.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.weights.follow import WeightFollower
from astraflow.weights.payload import apply_payload, build_payload, check_payload, spec_layout, state_layout
from astraflow.weights.publish import WeightPublisher, send_version
from astraflow.weights.store import ChunkStore, assemble, fetch, open_store
from provenance import begin, finish

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=256,
    vocab_size=2048,
)
TARGET_BOUND_FRACTION = 0.8
TARGET_COPY_FRACTION = 0.3
TARGET_FIRST_DELTA_BYTES = 25 * 2**20
TARGET_P50_MS = 500.0
COPY_BYTES = 256 * 2**20


def build_model(small: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**(SMALL if small else QWEN2_05B), tie_word_embeddings=True, max_position_embeddings=512)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def adamw_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int, seq: int, generator: torch.Generator
) -> float:
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=generator)  # [B, T]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def entropy_bits(n: int, k: int, value_bits: int = 16) -> float:
    """Positions entropy ``n·H(k/n)`` plus ``value_bits`` per changed element."""
    if k in (0, n):
        return float(value_bits * k)
    p = k / n
    return n * -(p * math.log2(p) + (1 - p) * math.log2(1 - p)) + value_bits * k


def difference_entropy(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    """Bits per changed element of the bf16 bit-pattern differences (new - old, modulo 2**16)."""
    counts = np.zeros(65536, dtype=np.int64)
    seen = set()
    for name, tensor in new.items():
        if id(tensor) in seen or tensor.dtype != torch.bfloat16:  # tied tensors once
            continue
        seen.add(id(tensor))
        diff = (tensor.reshape(-1).view(torch.int16).numpy() - old[name].reshape(-1).view(torch.int16).numpy()).view(
            np.uint16
        )
        counts += np.bincount(diff[diff != 0], minlength=65536)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of every tensor's bits, by name."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def matches_model(state: dict[str, torch.Tensor], model: torch.nn.Module) -> bool:
    """Whether ``state`` holds exactly the model's bf16 bits (one tensor converted at a time)."""
    expected = model.state_dict()
    return state.keys() == expected.keys() and all(
        torch.equal(
            state[name].reshape(-1).view(torch.int16), tensor.detach().to(torch.bfloat16).reshape(-1).view(torch.int16)
        )
        for name, tensor in expected.items()
    )


def follow(target: dict, topic: str, versions: int, pipe) -> None:
    """In its own process: a ``WeightFollower`` that reports, for each version it hands out, the
    version, the wall time, how long ``take`` (the in-place apply) took, and the digest of its state."""
    with open_log(**target) as log:
        follower = WeightFollower(log, topic, payload=True, poll_timeout=0.05).start()
        pipe.send("ready")
        for version in range(versions):
            follower.wait_for(version, timeout=600)
            started = time.perf_counter()
            taken = follower.take()
            took = time.perf_counter() - started
            pipe.send((taken[0] if taken else -1, time.time(), took, follower.shadow_bytes, follower.applied_ahead))
            pipe.send(digest(taken[1]) if taken else "")
            pipe.recv()  # the parent has measured its stages: wait for the next version
        follower.close()


def copy_rate(source: np.ndarray, target: np.ndarray, repeats: int = 3) -> float:
    """GB/s of the best of ``repeats`` plain in-memory copies (measured next to each version: the machine is shared)."""
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return source.nbytes / best / 1e9


def read_version(consumer, codec: Codec, version: int) -> tuple[WeightChunk, dict[int, bytes]]:
    """Poll until the manifest of ``version`` is in; its chunks precede it on the chunk partition."""
    manifest, pieces = None, {}
    while manifest is None or len(pieces) < manifest.num_chunks:
        for message in consumer.poll(max_records=64, timeout=1.0):
            record = codec.decode(message.value, expect=WeightChunk)
            if record.version != version:
                continue
            if record.kind == "manifest":
                manifest = record
            else:
                pieces[record.chunk_index] = record.data
    return manifest, pieces


def replay_apply(plan: list, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], repeats: int) -> float:
    """Best time of ``repeats`` more in-place applies of a delta (``plan``) onto the previous version
    ``old``, taken back in between by the inverse delta; ``old`` ends as ``new``.

    ``old`` is the publisher's copy of the previous version: its spare, which the next publish
    overwrites anyway."""
    best, undo = math.inf, None
    if repeats > 1:
        inverse = build_payload(old, new)  # new -> old, built while ``old`` still holds the previous version
        undo = check_payload(inverse.buffer, inverse.specs, state_layout(new))
    for repeat in range(repeats):
        if repeat:
            apply_payload(undo, old, in_place=True)
        started = time.perf_counter()
        apply_payload(plan, old, in_place=True)
        best = min(best, time.perf_counter() - started)
    return best


def best_send(
    producer,
    codec: Codec,
    topic: str,
    manifest: WeightChunk,
    payload: bytearray,
    chunk_bytes: int,
    repeats: int,
    store: ChunkStore | None = None,
) -> tuple[WeightChunk, float]:
    """Best time of ``repeats`` runs of publish steps 3-4 (``send_version``) for a payload in hand."""
    best, sent = math.inf, manifest
    for _ in range(repeats):
        started = time.perf_counter()
        sent = send_version(producer, codec, topic, manifest, payload, chunk_bytes, store)
        best = min(best, time.perf_counter() - started)
    return sent, best


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    """Train, publish every version, and time each stage (see the module docstring).

    Memory: the reader's state lives only in the follower process (the apply stage is its ``take``
    plus the section checks, timed here on the same payload), so that a 494M model fits 2 x 1 GB
    of bf16 copies next to its fp32 weights and AdamW state.
    """
    model = build_model(args.small)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(1)
    codec = Codec()
    rows, layout = [], None
    target = {"backend": "embedded", "path": str(workdir / "log.sqlite")}
    copy_buffers = np.ones(COPY_BYTES, dtype=np.uint8), np.empty(COPY_BYTES, dtype=np.uint8)
    with open_log(**target) as log, log.producer() as producer:
        topics = RunTopics("bench", "weights", ("main", "stored", "replay"))
        topics.ensure(log, partitions=1)
        topic = topics.weights("main")
        coders = {
            name: WeightsConfig(
                full_sync_interval=args.steps + 1,
                encode_workers=0 if name.startswith("serial") else None,
                entropy_coding="-plain" not in name,
                compiled_encode="-numpy" not in name,
            )
            for name in args.coders
        }
        config = coders[args.coders[0]]
        publisher = WeightPublisher(producer, codec, topic, "main", config, log=log)
        store = open_store(str(workdir / "store"))
        pipe, child_end = multiprocessing.Pipe()
        follower = multiprocessing.get_context("spawn").Process(
            target=follow, args=(target, topic, args.steps + 1, child_end)
        )
        follower.start()
        if pipe.recv() != "ready":
            raise RuntimeError("the follower process did not start")
        reader = log.consumer(group_id=None)
        reader.assign(
            [TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION), TopicPartition(topic, WEIGHTS_CHUNK_PARTITION)]
        )
        reader.seek_to_beginning()
        try:
            for version in range(args.steps + 1):
                loss = adamw_step(model, optimizer, args.batch, args.seq, generator) if version else None
                old = publisher.published.state if publisher.published else None
                started = time.time()
                coder = args.coders[version % len(args.coders)]  # alternating: both see the same machine
                publisher.config = coders[coder]
                publisher.publish(model.state_dict(), version)
                stats, new = publisher.last_stats, publisher.published.state
                taken, applied_at, take_s, shadow_bytes, applied_ahead = pipe.recv()
                followed = pipe.recv()
                applied_ms = (applied_at - started) * 1e3
                t0 = time.perf_counter()
                manifest, pieces = read_version(reader, codec, version)
                t1 = time.perf_counter()
                payload = assemble(manifest, pieces)
                t2 = time.perf_counter()
                plan = check_payload(payload, manifest.tensors, layout)
                check_s = time.perf_counter() - t2
                layout = spec_layout(manifest.tensors)
                bits = difference_entropy(old, new) if old is not None else None
                entropy = publisher.config.entropy_coding
                other = (
                    len(build_payload(new, old, entropy=not entropy).buffer) if old is not None else stats.total_bytes
                )
                coded_bytes, plain_bytes = (stats.total_bytes, other) if entropy else (other, stats.total_bytes)
                exact_replay = True
                if old is not None:
                    take_s = min(take_s, replay_apply(plan, old, new, args.repeats - 1))
                    exact_replay = all(
                        torch.equal(old[name].reshape(-1).view(torch.uint8), new[name].reshape(-1).view(torch.uint8))
                        for name in new
                    )
                repeats = args.repeats if version else 1  # the full version once: the targets are about deltas
                _, resend_s = best_send(
                    producer, codec, topics.weights("replay"), manifest, payload, config.chunk_bytes, repeats - 1
                )
                stored, store_s = best_send(
                    producer, codec, topics.weights("stored"), manifest, payload, config.chunk_bytes, repeats, store
                )
                t4 = time.perf_counter()
                fetch(stored, {})
                t5 = time.perf_counter()
                pipe.send("next")
                exact = taken == version and followed == digest(new) and matches_model(new, model) and exact_replay
                del payload, pieces, plan
                rows.append(
                    {
                        "version": version,
                        "encoding": stats.encoding,
                        "loss": loss,
                        "bytes": coded_bytes,
                        "plain_bytes": plain_bytes,
                        "published_bytes": stats.total_bytes,
                        "elements": stats.elements,
                        "changed": stats.changed,
                        "changes": stats.changes,
                        "exact": exact,
                        "difference_bits": bits,
                        "copy_GBps": copy_rate(*copy_buffers),
                        "seconds": {
                            "encode": stats.encode_seconds,
                            "publish": min(stats.send_seconds, resend_s),
                            "fetch": t1 - t0,
                            "assemble": t2 - t1,
                            "apply": check_s + take_s,
                            "store_publish": store_s,
                            "store_fetch": t5 - t4,
                        },
                        "publish_to_applied_ms": applied_ms,
                        "coder": coder,
                        "follower_shadow_bytes": shadow_bytes,
                        "follower_applied_ahead": applied_ahead,
                    }
                )
                print(
                    f"version {version} ({stats.encoding}, {coder}): {stats.total_bytes / 2**20:.1f} MiB, "
                    f"{stats.changed / stats.elements:.2%} changed, exact={exact}, "
                    f"publish→applied {applied_ms:.0f} ms, "
                    f"publish {rows[-1]['seconds']['publish'] * 1e3:.0f} ms, apply {(check_s + take_s) * 1e3:.0f} ms "
                    f"(check {check_s * 1e3:.0f}), copy {rows[-1]['copy_GBps']:.1f} GB/s",
                    flush=True,
                )
        finally:
            follower.join(timeout=60)
            reader.close()
    return {"rows": rows, "parameters": sum(p.numel() for p in model.parameters())}


def summarize(measured: dict) -> dict:
    rows = measured["rows"]
    full_bytes = rows[0]["bytes"]
    steps = []
    for row in rows[1:]:
        copy = row["copy_GBps"] * 1e9
        n, k = row["elements"], row["changed"]
        global_bits = entropy_bits(n, k)
        per_tensor_bits = sum(entropy_bits(tn, tk) for _, tn, tk in row["changes"])
        ratio = full_bytes / max(row["bytes"], 1)
        bound_ratio = full_bytes * 8 / global_bits
        difference_bits = entropy_bits(n, k, row["difference_bits"])
        s = row["seconds"]
        rates = {stage: full_bytes / seconds / 1e9 for stage, seconds in s.items()}
        publish_apply = full_bytes / (s["publish"] + s["apply"])
        store_publish_apply = full_bytes / (s["store_publish"] + s["apply"])
        end_to_end = full_bytes / sum(s[stage] for stage in ("encode", "publish", "fetch", "assemble", "apply"))
        steps.append(
            {
                "version": row["version"],
                "loss_before": row["loss"],
                "exact": row["exact"],
                "changed_fraction": k / n,
                "delta_bytes": row["bytes"],
                "plain_delta_bytes": row["plain_bytes"],
                "coder": row["coder"],
                "full_bytes": full_bytes,
                "ratio": ratio,
                "delta_bits_per_change": row["bytes"] * 8 / k,
                "difference_entropy_bits": row["difference_bits"],
                "entropy_bound_bytes": {
                    "global": global_bits / 8,
                    "per_tensor": per_tensor_bits / 8,
                    "with_differences": difference_bits / 8,
                },
                "bound_ratio": {
                    "global": bound_ratio,
                    "per_tensor": full_bytes * 8 / per_tensor_bits,
                    "with_differences": full_bytes * 8 / difference_bits,
                },
                "fraction_of_bound": {
                    "global": ratio / bound_ratio,
                    "per_tensor": ratio / (full_bytes * 8 / per_tensor_bits),
                    "with_differences": ratio / (full_bytes * 8 / difference_bits),
                },
                "reference_bytes": {"uint32_indices_values": 6 * k, "bitmap_values": n / 8 + 2 * k},
                "seconds": s,
                "rate_GBps": rates,
                "publish_to_applied_ms": row["publish_to_applied_ms"],
                "publish_plus_apply_GBps": publish_apply / 1e9,
                "end_to_end_GBps": end_to_end / 1e9,
                "copy_GBps": row["copy_GBps"],
                "publish_plus_apply_of_copy": publish_apply / copy,
                "end_to_end_of_copy": end_to_end / copy,
                "store_publish_plus_apply_of_copy": store_publish_apply / copy,
            }
        )
    first = steps[0]
    end_to_end = {}
    for coder in sorted({row["coder"] for row in rows[1:]}):
        times = [row["publish_to_applied_ms"] for row in rows[1:] if row["coder"] == coder]
        end_to_end[coder] = {
            "versions": len(times),
            "p50_ms": float(np.percentile(times, 50)),
            "p99_ms": float(np.percentile(times, 99)),
        }
    return {
        "end_to_end": end_to_end,
        "follower_shadow_bytes": max(row["follower_shadow_bytes"] for row in rows),
        "follower_applied_ahead": rows[-1]["follower_applied_ahead"],
        "full_version": {
            "bytes": full_bytes,
            "seconds": rows[0]["seconds"],
            "exact": rows[0]["exact"],
            "publish_to_applied_ms": rows[0]["publish_to_applied_ms"],
        },
        "copy_GBps": float(np.median([row["copy_GBps"] for row in rows])),
        "steps": steps,
        "targets": {
            "delta_within_80pct_of_entropy_bound": first["fraction_of_bound"]["global"] >= TARGET_BOUND_FRACTION,
            "delta_within_80pct_of_difference_bound": first["fraction_of_bound"]["with_differences"]
            >= TARGET_BOUND_FRACTION,
            "first_delta_at_most_25MiB": first["delta_bytes"] <= TARGET_FIRST_DELTA_BYTES,
            "publish_to_applied_p50_at_most_500ms": min(e["p50_ms"] for e in end_to_end.values()) <= TARGET_P50_MS,
            "publish_plus_apply_30pct_of_copy": first["publish_plus_apply_of_copy"] >= TARGET_COPY_FRACTION,
            "all_exact": all(row["exact"] for row in measured["rows"]),
        },
    }


def plot(path: Path, summary: dict, caption: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = summary["steps"]
    fig, (sizes, speeds) = plt.subplots(1, 2, figsize=(13, 4.8))
    labels = [f"v{s['version']}\n{s['changed_fraction']:.2%} changed" for s in steps]
    x = np.arange(len(steps))
    mib = 2**20
    series = [
        ("uint32 idx + values", [s["reference_bytes"]["uint32_indices_values"] for s in steps]),
        ("bitmap + values", [s["reference_bytes"]["bitmap_values"] for s in steps]),
        ("entropy bound, 16-bit values", [s["entropy_bound_bytes"]["global"] for s in steps]),
        ("our delta, no entropy coding", [s["plain_delta_bytes"] for s in steps]),
        ("our delta", [s["delta_bytes"] for s in steps]),
        ("entropy bound, value differences", [s["entropy_bound_bytes"]["with_differences"] for s in steps]),
    ]
    for i, (name, values) in enumerate(series):
        bars = sizes.bar(x + (i - 2.5) * 0.14, [v / mib for v in values], 0.14, label=name)
        if name == "our delta":
            sizes.bar_label(bars, [f"{s['ratio']:.1f}x" for s in steps], fontsize=8)
    sizes.axhline(summary["full_version"]["bytes"] / mib, color="grey", ls="--", label="full bf16 version")
    sizes.set_xticks(x, labels)
    sizes.set_yscale("log")
    sizes.set_ylabel("MiB per version")
    sizes.set_title("Delta size vs full version and entropy bound")
    sizes.legend(fontsize=8)
    first = steps[0]
    stages = ["encode", "publish", "fetch", "assemble", "apply", "store_publish", "store_fetch"]
    store_publish_apply = first["store_publish_plus_apply_of_copy"] * first["copy_GBps"]
    values = (
        [first["copy_GBps"]]
        + [first["rate_GBps"][s] for s in stages]
        + [first["publish_plus_apply_GBps"], store_publish_apply, first["end_to_end_GBps"]]
    )
    names = ["in-memory copy"] + stages + ["publish+apply", "store_publish+apply", "end to end"]
    colors = ["grey"] + ["tab:blue"] * 5 + ["tab:green"] * 2 + ["tab:orange", "tab:olive", "tab:red"]
    bars = speeds.bar(names, values, color=colors)
    speeds.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=8)
    speeds.axhline(first["copy_GBps"] * TARGET_COPY_FRACTION, color="tab:orange", ls=":", label="target: 30% of copy")
    speeds.set_yscale("log")
    speeds.set_ylabel("model GB/s (full bf16 bytes / stage time)")
    speeds.set_title(f"Throughput, first delta (v{first['version']}), embedded log")
    plt.setp(speeds.get_xticklabels(), rotation=35, ha="right")
    speeds.legend(fontsize=8)
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny Qwen2 (seconds), to check the script")
    parser.add_argument("--steps", type=int, default=3, help="AdamW steps, each published as a delta")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1, as the trainer's default train.threads: on a shared machine a second "
        "OpenMP thread stalls every parallel region while the other core is busy)",
    )
    parser.add_argument(
        "--coders",
        type=lambda text: text.split(","),
        default=["streamed", "serial"],
        help="publish paths, taking turns by version from the first (which publishes the full version 0): serial "
        "(encode all, then send: weights.encode_workers 0) "
        "and streamed (encoded on every core while chunks go out; the follower applies them to its shadow); "
        "either with -plain: without entropy coding, with -numpy: without the C kernel (weights.compiled_encode)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each publish and apply stage; the best counts")
    parser.add_argument("--out", type=Path, default=RESULTS / "weights")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    record = begin()  # no config file: the model shape and the arguments, in the command, are the workload
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(args, Path(tmp))
    summary = summarize(measured)
    first = summary["steps"][0]
    model_name = "tiny Qwen2 (--small)" if args.small else "Qwen2-0.5B-shaped"
    caption = (
        f"{model_name}, {measured['parameters'] / 1e6:.1f}M params, AdamW lr {args.lr:g}, "
        f"batch {args.batch}x{args.seq}, "
        f"{args.threads} threads, {platform.machine()}, load average {load_before[0]:.1f}\n"
        f"first delta {first['ratio']:.1f}x = "
        f"{first['fraction_of_bound']['global']:.0%} of the 16-bit-value entropy bound "
        f"({first['fraction_of_bound']['with_differences']:.0%} of the bound on value differences); publish+apply "
        f"{first['publish_plus_apply_of_copy']:.0%} of copy "
        f"(store transport: {first['store_publish_plus_apply_of_copy']:.0%})"
    )
    result = {
        "model": model_name,
        "parameters": measured["parameters"],
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "load_average_before_after": [load_before, os.getloadavg()],
        },
        **summary,
        "provenance": finish(record),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(args.out.with_suffix(".png"), summary, caption)
    print(caption)
    print(json.dumps(summary["targets"]))


if __name__ == "__main__":
    main()
