"""Helpers for tests of what a run gives other tools: start ``astraflow metrics serve`` as a
subprocess, scrape and poll it; read TensorBoard event files back with TensorBoard's own reader."""

from __future__ import annotations

import selectors
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ASTRAFLOW = Path(sys.executable).with_name("astraflow")
Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name → [(labels, value)] of one scrape."""


def start_serve(run_dir: Path, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """``astraflow metrics serve RUN_DIR --port 0`` and the URL it printed once listening."""
    process = subprocess.Popen(
        [str(ASTRAFLOW), "metrics", "serve", str(run_dir), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline, seen = time.monotonic() + timeout, ""
    while time.monotonic() < deadline and process.poll() is None:
        if selector.select(timeout=1.0):
            line = process.stdout.readline()
            seen += line
            if line.startswith("serving "):
                return process, line.split()[1]
    process.kill()
    raise AssertionError(f"metrics serve printed no URL: {seen}")


def scrape(url: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float | None:
    """The sum over the series of ``name`` whose labels include ``labels``; ``None`` when there is none."""
    values = [value for have, value in samples.get(name, []) if labels.items() <= have.items()]
    return sum(values) if values else None


def poll(url: str, condition: Callable[[Samples], bool], timeout: float, alive: Callable[[], bool]) -> Samples:
    """Scrape ``url`` until ``condition`` holds of a scrape; fail after ``timeout`` or once ``alive`` is false."""
    deadline = time.monotonic() + timeout
    samples: Samples = {}
    while time.monotonic() < deadline and alive():
        samples = scrape(url)
        if condition(samples):
            return samples
        time.sleep(0.5)  # the pace of the polling, not a wait for something to happen
    raise AssertionError(f"condition never held; last scrape: {sorted(samples)}")


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under ``directory`` as TensorBoard itself reads it: tag → [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }
