"""Weight versions on the log: sparse bf16 deltas against full versions, on a Qwen2-0.5B-shaped model.

What it measures (issue #5), on a randomly initialised Qwen2 (hidden 896, 24 layers, 14 heads,
2 kv heads, intermediate 4864, vocab 151936, tied embeddings: 494M parameters, fp32, CPU) that
takes ``--steps`` AdamW steps (lr 1e-6) on real gradients of small random-token batches:

1. Size: per step, the fraction of bf16 elements whose bits changed, the delta's bytes against
   the full bf16 version's bytes, and the entropy bound: ``n·H(k/n) + 16·k`` bits (positions
   + 16 bits per changed value; ``global`` over all elements as in the issue, ``per_tensor``
   summed per tensor, which is tighter). Plain ``uint32`` indices and bitmap + values are shown
   for reference. Target: our compression ratio >= 80% of the global bound's.
2. Speed, in *model bytes* (the full bf16 version's size) per second, through the embedded log:
   ``encode`` (fp32 → bf16 copy + delta), ``publish`` (sha256, chunks, send, flush), ``fetch``
   (read and decode the records), ``assemble`` (join chunks, sha256), ``apply`` (rebuild the bf16
   state from base + delta), against a plain in-memory copy of the same number of bytes. Target:
   publish + apply >= 30% of the copy rate; ``end_to_end`` also counts encode, fetch and assemble.
   ``publish_to_applied_ms`` is the wall time from the start of ``publish`` to a background
   ``WeightFollower`` handing the version out (what producers report as ``weights_applied_ms``).

Writes ``benchmarks/results/weights.json`` and ``.png``.

    .venv/bin/python benchmarks/weights.py [--small] [--steps 3] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from astraflow.config import WeightsConfig
from astraflow.log import TopicPartition, open_log
from astraflow.schemas.codec import Codec
from astraflow.schemas.records import WeightChunk
from astraflow.topics import WEIGHTS_CHUNK_PARTITION, WEIGHTS_MANIFEST_PARTITION, RunTopics
from astraflow.weights.follow import WeightFollower, assemble
from astraflow.weights.payload import read_payload, to_transfer
from astraflow.weights.publish import WeightPublisher

RESULTS = Path(__file__).resolve().parent / "results"
QWEN2_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)
SMALL = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256, vocab_size=2048)
TARGET_BOUND_FRACTION = 0.8
TARGET_COPY_FRACTION = 0.3


def build_model(small: bool) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**(SMALL if small else QWEN2_05B), tie_word_embeddings=True, max_position_embeddings=512)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def adamw_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int, seq: int, generator: torch.Generator) -> float:
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


def copy_seconds(nbytes: int, repeats: int = 3) -> float:
    source, target = np.ones(nbytes, dtype=np.uint8), np.empty(nbytes, dtype=np.uint8)
    best = math.inf
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return best


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


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).view(torch.uint8)

    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(raw(a[k]), raw(b[k])) for k in a)


def measure(args: argparse.Namespace, workdir: Path) -> dict:
    model = build_model(args.small)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(1)
    codec = Codec()
    rows, held = [], None
    with open_log("embedded", path=workdir / "log.sqlite") as log, log.producer() as producer:
        topics = RunTopics("bench", "weights", ("main",))
        topics.ensure(log, partitions=1)
        topic = topics.weights("main")
        publisher = WeightPublisher(producer, codec, topic, "main", WeightsConfig(full_sync_interval=args.steps + 1))
        follower = WeightFollower(log, topic, payload=True, poll_timeout=0.05).start()
        reader = log.consumer(group_id=None)
        reader.assign([TopicPartition(topic, WEIGHTS_MANIFEST_PARTITION), TopicPartition(topic, WEIGHTS_CHUNK_PARTITION)])
        reader.seek_to_beginning()
        try:
            for version in range(args.steps + 1):
                loss = adamw_step(model, optimizer, args.batch, args.seq, generator) if version else None
                started = time.perf_counter()
                manifest = publisher.publish(model.state_dict(), version)
                follower.wait_for(version, timeout=600)
                taken = follower.take()
                applied_ms = (time.perf_counter() - started) * 1e3
                t0 = time.perf_counter()
                manifest, pieces = read_version(reader, codec, version)
                t1 = time.perf_counter()
                payload = assemble(manifest, pieces)
                t2 = time.perf_counter()
                state = read_payload(payload, manifest.tensors, held)
                t3 = time.perf_counter()
                expected = to_transfer(model.state_dict(), "bf16")
                exact = bits_equal(state, expected) and taken is not None and taken[0] == version and bits_equal(taken[1], expected)
                held = state
                stats = publisher.last_stats
                rows.append({"version": version, "encoding": stats.encoding, "loss": loss, "bytes": stats.total_bytes,
                             "elements": stats.elements, "changed": stats.changed, "changes": stats.changes, "exact": exact,
                             "seconds": {"encode": stats.encode_seconds, "publish": stats.send_seconds, "fetch": t1 - t0,
                                         "assemble": t2 - t1, "apply": t3 - t2},
                             "publish_to_applied_ms": applied_ms})
                print(f"version {version} ({stats.encoding}): {stats.total_bytes / 2**20:.1f} MiB, "
                      f"{stats.changed / stats.elements:.2%} changed, exact={exact}, publish→applied {applied_ms:.0f} ms")
        finally:
            follower.close()
            reader.close()
    return {"rows": rows, "parameters": sum(p.numel() for p in model.parameters())}


def summarize(measured: dict, copy_s: float) -> dict:
    rows = measured["rows"]
    full_bytes = rows[0]["bytes"]
    copy_rate = full_bytes / copy_s
    steps = []
    for row in rows[1:]:
        n, k = row["elements"], row["changed"]
        global_bits = entropy_bits(n, k)
        per_tensor_bits = sum(entropy_bits(tn, tk) for _, tn, tk in row["changes"])
        ratio = full_bytes / max(row["bytes"], 1)
        bound_ratio = full_bytes * 8 / global_bits
        s = row["seconds"]
        rates = {stage: full_bytes / seconds / 1e9 for stage, seconds in s.items()}
        publish_apply = full_bytes / (s["publish"] + s["apply"])
        end_to_end = full_bytes / sum(s.values())
        steps.append({
            "version": row["version"], "loss_before": row["loss"], "exact": row["exact"],
            "changed_fraction": k / n, "delta_bytes": row["bytes"], "full_bytes": full_bytes, "ratio": ratio,
            "entropy_bound_bytes": {"global": global_bits / 8, "per_tensor": per_tensor_bits / 8},
            "bound_ratio": {"global": bound_ratio, "per_tensor": full_bytes * 8 / per_tensor_bits},
            "fraction_of_bound": {"global": ratio / bound_ratio, "per_tensor": ratio / (full_bytes * 8 / per_tensor_bits)},
            "reference_bytes": {"uint32_indices_values": 6 * k, "bitmap_values": n / 8 + 2 * k},
            "seconds": s, "rate_GBps": rates, "publish_to_applied_ms": row["publish_to_applied_ms"],
            "publish_plus_apply_GBps": publish_apply / 1e9, "end_to_end_GBps": end_to_end / 1e9,
            "publish_plus_apply_of_copy": publish_apply / copy_rate, "end_to_end_of_copy": end_to_end / copy_rate,
        })
    first = steps[0]
    return {
        "full_version": {"bytes": full_bytes, "seconds": rows[0]["seconds"], "exact": rows[0]["exact"],
                         "publish_to_applied_ms": rows[0]["publish_to_applied_ms"]},
        "copy_GBps": copy_rate / 1e9,
        "steps": steps,
        "targets": {
            "delta_within_80pct_of_entropy_bound": first["fraction_of_bound"]["global"] >= TARGET_BOUND_FRACTION,
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
    series = [("uint32 idx + values", [s["reference_bytes"]["uint32_indices_values"] for s in steps]),
              ("bitmap + values", [s["reference_bytes"]["bitmap_values"] for s in steps]),
              ("our delta", [s["delta_bytes"] for s in steps]),
              ("entropy bound", [s["entropy_bound_bytes"]["global"] for s in steps])]
    for i, (name, values) in enumerate(series):
        bars = sizes.bar(x + (i - 1.5) * 0.2, [v / mib for v in values], 0.2, label=name)
        if name == "our delta":
            sizes.bar_label(bars, [f"{s['ratio']:.1f}x" for s in steps], fontsize=8)
    sizes.axhline(summary["full_version"]["bytes"] / mib, color="grey", ls="--", label="full bf16 version")
    sizes.set_xticks(x, labels)
    sizes.set_yscale("log")
    sizes.set_ylabel("MiB per version")
    sizes.set_title("Delta size vs full version and entropy bound")
    sizes.legend(fontsize=8)
    first = steps[0]
    stages = ["encode", "publish", "fetch", "assemble", "apply"]
    values = [summary["copy_GBps"]] + [first["rate_GBps"][s] for s in stages] + [first["publish_plus_apply_GBps"], first["end_to_end_GBps"]]
    names = ["in-memory copy"] + stages + ["publish+apply", "end to end"]
    bars = speeds.bar(names, values, color=["grey"] + ["tab:blue"] * len(stages) + ["tab:orange", "tab:red"])
    speeds.bar_label(bars, [f"{v:.2f}" for v in values], fontsize=8)
    speeds.axhline(summary["copy_GBps"] * TARGET_COPY_FRACTION, color="tab:orange", ls=":", label="target: 30% of copy")
    speeds.set_yscale("log")
    speeds.set_ylabel("model GB/s (full bf16 bytes / stage time)")
    speeds.set_title(f"Throughput, first delta (v{first['version']}), embedded log")
    speeds.tick_params(axis="x", labelrotation=30)
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
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=RESULTS / "weights")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        measured = measure(args, Path(tmp))
    summary = summarize(measured, copy_seconds(measured["rows"][0]["bytes"]))
    first = summary["steps"][0]
    model_name = "tiny Qwen2 (--small)" if args.small else "Qwen2-0.5B-shaped"
    caption = (f"{model_name}, {measured['parameters'] / 1e6:.1f}M params, AdamW lr {args.lr:g}, batch {args.batch}x{args.seq}, "
               f"{args.threads} threads, {platform.machine()}; first delta {first['ratio']:.1f}x = "
               f"{first['fraction_of_bound']['global']:.0%} of the entropy bound, publish+apply "
               f"{first['publish_plus_apply_of_copy']:.0%} of copy")
    result = {"model": model_name, "parameters": measured["parameters"], "args": {k: str(v) for k, v in vars(args).items()},
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__}, **summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    plot(args.out.with_suffix(".png"), summary, caption)
    print(caption)
    print(json.dumps(summary["targets"]))


if __name__ == "__main__":
    main()
