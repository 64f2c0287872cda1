"""The metric-name catalogue (``astraflow.core.metric_names``): well formed, unique, documented, and the
only source of the names that components pass to ``ComponentContext.metric``."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import astraflow
from astraflow.core import metric_names

PACKAGE = Path(astraflow.__file__).parent
NAME = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
PREFIX = re.compile(r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\.")
BUILDERS = {
    "train_metric": metric_names.TRAIN_PREFIX,
    "stream_dropped": metric_names.STREAM_DROPPED_PREFIX,
    "stream_offline_dropped": metric_names.STREAM_OFFLINE_DROPPED_PREFIX,
    "eval_system": metric_names.EVAL_SYSTEM_PREFIX,
}
"""The catalogue's name-building functions and the prefix each puts before its argument."""


def constants() -> dict[str, str]:
    """Every upper-case string constant of the catalogue: names and prefixes."""
    return {key: value for key, value in vars(metric_names).items() if key.isupper() and isinstance(value, str)}


def names() -> dict[str, str]:
    return {key: value for key, value in constants().items() if not key.endswith("_PREFIX")}


def prefixes() -> dict[str, str]:
    return {key: value for key, value in constants().items() if key.endswith("_PREFIX")}


def sources() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_name_is_dotted_lower_case_and_named_after_its_value() -> None:
    assert len(names()) >= 30
    for constant, value in names().items():
        assert NAME.fullmatch(value), f"{constant} = {value!r} is not a dotted lower-case name"
        assert constant == value.upper().replace(".", "_"), f"{constant} should be named after {value!r}"


def test_every_prefix_ends_with_a_dot_and_is_named_after_its_value() -> None:
    assert prefixes()
    for constant, value in prefixes().items():
        assert PREFIX.fullmatch(value), f"{constant} = {value!r} is not a dotted lower-case prefix"
        assert constant == value[:-1].upper().replace(".", "_") + "_PREFIX"


def test_no_two_constants_share_a_value() -> None:
    shared = {value: count for value, count in Counter(constants().values()).items() if count > 1}
    assert not shared, f"values defined more than once: {shared}"


def test_every_constant_has_a_docstring() -> None:
    body = ast.parse(Path(metric_names.__file__).read_text()).body
    documented = set()
    for statement, following in zip(body, body[1:]):
        if (
            isinstance(statement, ast.Assign)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            documented.update(target.id for target in statement.targets if isinstance(target, ast.Name))
    assert set(constants()) <= documented, f"without a docstring: {sorted(set(constants()) - documented)}"


def test_the_catalogue_imports_nothing_from_astraflow() -> None:
    for node in ast.walk(ast.parse(Path(metric_names.__file__).read_text())):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("astraflow")
        elif isinstance(node, ast.Import):
            assert not any(alias.name.startswith("astraflow") for alias in node.names)


def test_builders_put_their_prefix_before_the_part() -> None:
    for function, prefix in BUILDERS.items():
        assert getattr(metric_names, function)("part") == prefix + "part"
    assert metric_names.train_metric("loss") == metric_names.TRAIN_LOSS
    assert metric_names.eval_system("judge_accuracy") == metric_names.EVAL_SYSTEM_JUDGE_ACCURACY
    assert metric_names.stream_dropped("stale") == "stream.dropped.stale"
    assert metric_names.stream_offline_dropped("stale") == "stream.offline_dropped.stale"


def _problem(node: ast.expr) -> str | None:
    """Why the first argument of a ``.metric(`` call is not a name from the catalogue, or None."""
    if isinstance(node, ast.Constant):
        return None if node.value in names().values() else f"literal {node.value!r} is not in the catalogue"
    if isinstance(node, ast.JoinedStr):  # f"train.{name}": the same as the catalogue's builder
        head, *rest = node.values
        if (
            isinstance(head, ast.Constant)
            and head.value in BUILDERS.values()
            and len(rest) == 1
            and isinstance(rest[0], ast.FormattedValue)
        ):
            return None
        return f"f-string {ast.unparse(node)} is not built from a catalogue prefix"
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return None if name in names() else f"{ast.unparse(node)} is not a catalogue constant"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
        name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        return None if name in BUILDERS else f"{ast.unparse(node)} is not a catalogue function"
    return f"{ast.unparse(node)} is not a name from the catalogue"


def test_every_metric_call_takes_its_name_from_the_catalogue() -> None:
    calls, problems = 0, []
    for path, tree in sources():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "metric"
                and node.args
            ):
                calls += 1
                problem = _problem(node.args[0])
                if problem is not None:
                    problems.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {problem}")
    assert calls >= 25
    assert not problems, "\n".join(problems)


def test_names_are_not_spelled_outside_the_catalogue() -> None:
    """A reader that picks a metric out by a literal name would miss a rename in the catalogue."""
    catalogue = set(constants().values())
    found = []
    for path, tree in sources():
        where = path.relative_to(PACKAGE).as_posix()
        if where == "core/metric_names.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in catalogue:
                found.append(f"{where}:{node.lineno}: {node.value!r}")
    assert not found, "\n".join(found)


def docstrings() -> dict[str, str]:
    """Each constant of the catalogue and its docstring."""
    body = ast.parse(Path(metric_names.__file__).read_text()).body
    found = {}
    for statement, following in zip(body, body[1:]):
        if isinstance(statement, ast.Assign) and isinstance(following, ast.Expr):
            for target in statement.targets:
                if isinstance(target, ast.Name) and isinstance(following.value, ast.Constant):
                    found[target.id] = str(following.value.value)
    return found


def test_a_name_is_a_counter_exactly_when_its_docstring_says_it_counts_up() -> None:
    """Exporters take a name's kind from ``metric_names.kind``; its docstring is what a reader sees."""
    docs = docstrings()
    for constant, value in constants().items():
        name = value + "part" if constant.endswith("_PREFIX") else value
        counts_up = "so far" in docs[constant] or "cumulative" in docs[constant]
        if constant in ("TRAIN_PREFIX", "EVAL_SYSTEM_PREFIX", "ROLLOUT_PREFIX"):
            continue  # prefixes of names of every kind
        assert (metric_names.kind(name) == "counter") == counts_up, f"{constant}: {metric_names.kind(name)}"


def test_histograms_have_rising_buckets_and_gauges_are_the_rest() -> None:
    histograms = [value for value in names().values() if metric_names.kind(value) == "histogram"]
    assert metric_names.STREAM_GROUP_REWARD in histograms and metric_names.TRAIN_STEP_SECONDS in histograms
    for name in histograms:
        buckets = metric_names.histogram_buckets(name)
        assert len(buckets) >= 5 and list(buckets) == sorted(set(buckets)), name
    assert metric_names.kind(metric_names.TRAIN_VERSION) == "gauge"
    assert metric_names.kind(metric_names.EVAL_ACCURACY) == "gauge"
    assert metric_names.kind(metric_names.stream_dropped("stale")) == "counter"
    assert metric_names.kind(metric_names.ROLLOUT_TRAJECTORIES) == "counter"
