"""The repository explains itself (issue #19): it points nowhere outside itself, its links resolve,
and every figure it quotes is a named field of the committed run its row names (issue #50).

Figures live in tables: the one under "Main figures" in README.md and every table of
docs/benchmarks.md. A row names its result file (``benchmarks/results/NAME.json``) and, in a hidden
comment in its result cell, one field of that file for each number of its other cells (code spans,
the command and the commit left out), in the order the numbers are written::

    | ... 0.38 → 0.93 in 330 versions and 268 s | [main_job_summary.json](...) <!-- fields:
      base_accuracy, final_mean_of_last_two, versions, wall_seconds --> |

Each number must be the value of its field, rounded as the row shows it; a unit after the number
rescales it (``%``, ``k``, ``M``, ``MiB``, ``MB``, ``GB``, ``ms`` ...). Matching a number anywhere
in the file, as this test once did, let a figure of another run pass on an unrelated timestamp.

A field is a path: ``runs[1].result.solver.base``, ``engines["openai/vllm"].tokens_per_s`` for a key
that is not a plain name. A path starting with a dot is read from the object that held the field
before it (``runs[1].result.solver.base, .gain``). A field holding a string offers the numbers
written in it (``"1node-secure-faust"``); ``len(PATH)`` is the number of items of a list or object;
``PATH~`` is the name of the field itself, for the few settings a result records only there
(``targets.delta_within_80pct_of_entropy_bound~``, as JSONPath-Plus spells it). A hyphenated name
that starts with a letter (ZeRO-3, Qwen2-0.5B) is a name, not a figure. Outside those tables the
figures sections hold no numbers at all, so none escapes the check; and a test moves the last
digit of every figure, one at a time, and asserts the check then reports it, so that no figure
rests on a field that would take another value as well.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKDOWN = [REPO / "README.md", *DOCS]
README = REPO / "README.md"
BENCHMARKS_DOC = REPO / "docs" / "benchmarks.md"
FIGURE_DOCS = (README, BENCHMARKS_DOC)
FIGURES_HEADING = "Main figures"
# Guidance kept outside the repository; spelled in pieces so that this file does not name them.
OUTSIDE = tuple(name + ".md" for name in ("DESIGN", "ALGORITHMS", "PERFORMANCE")) + (".." + "/shared",)

CODE_SPAN = re.compile(r"`[^`\n]*`")
HTML_COMMENT = re.compile(r"<!--.*?-->")
FIELDS = re.compile(r"<!--\s*fields:(.*?)-->")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
RESULT = re.compile(r"benchmarks/results/[\w.-]+\.json")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
# A hyphenated name that starts with a letter (ZeRO-3, Qwen2-0.5B-shaped): the numbers in it are no figures.
NAME = re.compile(r"(?<![\w.])[A-Za-z][\w.]*(?:-[\w.]+)+")
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
NUMBER_IN_TEXT = re.compile(r"\d+(?:\.\d+)?")
UNIT = re.compile(r"\s?(%|x|k|M|kB|MB|MiB|GB|GiB|ms|µs|s|B)(?![A-Za-z])")
SCALES = {
    None: (1.0,),
    "%": (0.01, 1.0),
    "x": (1.0,),
    "k": (1e3,),
    "M": (1e6,),
    "kB": (1e3, 1.0),
    "MB": (1e6, 1.0),
    "MiB": (2.0**20, 1.0),
    "GB": (1e9, 1.0),
    "GiB": (2.0**30, 1.0),
    "ms": (1e-3, 1.0),
    "µs": (1e-6, 1.0),
    "s": (1.0,),
    "B": (1.0,),
}
SKIPPED_COLUMNS = {"command", "result", "commit"}
# One step of a field path: .name, [index] or ["any key"].
PATH_STEP = re.compile(r'\.([\w-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]')
PLAIN_KEY = re.compile(r"[\w-]+")
# A code span (to its closing backtick, or the end of the row) or a cell border.
CELL_BORDER = re.compile(r"`[^`]*(?:`|$)|(\|)")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout


# --- (a) nothing points outside the repository -------------------------------------------------


def test_nothing_outside_docs_names_the_guidance_kept_outside_the_repository() -> None:
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    if listed is None:
        pytest.skip("not a git checkout")
    offenders = []
    for name in filter(None, listed.split("\0")):
        path = REPO / name
        if name.startswith("docs/") or not path.is_file():
            continue
        data = path.read_bytes()
        offenders += [f"{name}: {needle}" for needle in OUTSIDE if needle.encode() in data]
    assert not offenders, "point into docs/ instead:\n" + "\n".join(offenders)


# --- (b) links resolve ------------------------------------------------------------------------


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = LINK.sub(r"\1", heading).strip().lower()
    return "".join(ch for ch in text if ch.isalnum() or ch in " _-").replace(" ", "-")


@functools.cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for _, line in _prose(path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return frozenset(anchors)


def _links(path: Path) -> list[tuple[int, str]]:
    return [
        (number, match.group(2))
        for number, line in _prose(path.read_text(encoding="utf-8"))
        for match in LINK.finditer(CODE_SPAN.sub("", line))
    ]


def _broken(source: Path, target: str) -> str | None:
    """Why ``target`` (a link in ``source``) does not resolve inside the repository; None if it does."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path_part, _, anchor = target.partition("#")
    resolved = (source.parent / path_part).resolve() if path_part else source
    if not resolved.is_relative_to(REPO):
        return "leaves the repository"
    if not resolved.exists():
        return "no such file"
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        return f"no heading #{anchor} in {resolved.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("doc", MARKDOWN, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(doc: Path) -> None:
    broken = [
        f"{doc.relative_to(REPO)}:{number}: {target}: {why}"
        for number, target in _links(doc)
        if (why := _broken(doc, target)) is not None
    ]
    assert not broken, "\n".join(broken)


def test_a_link_to_a_missing_file_or_heading_is_reported() -> None:
    readme = REPO / "README.md"
    assert _broken(readme, "docs/no_such_page.md") == "no such file"
    assert _broken(readme, "docs/architecture.md#no-such-heading") is not None
    assert _broken(readme, "../outside.md") == "leaves the repository"
    assert _broken(readme, "docs/architecture.md#package-layers") is None


# --- (c) figures are named fields of committed results -----------------------------------------


class Figure(NamedTuple):
    """A number as a row writes it."""

    written: str  # "22,460"
    value: float
    half: float  # half a unit of its last digit: how far rounding may have moved it
    unit: str | None
    start: int  # where the number starts in the text it was read from
    end: int  # just past its last digit

    def shown(self, text: str) -> str:
        """The figure with its unit, as ``text`` writes it: ``268 s``, ``0.54x``."""
        unit = UNIT.match(text, self.end) if self.unit else None
        return text[self.start : unit.end() if unit else self.end]


class Field(NamedTuple):
    """A field of a result file that a figure is read from."""

    steps: tuple[str | int, ...]
    read: str  # "value", "len" (its number of items) or "name" (the numbers written in its own name)

    def __str__(self) -> str:
        path = "".join(
            f"[{step}]"
            if isinstance(step, int)
            else (f".{step}" if PLAIN_KEY.fullmatch(step) else f"[{json.dumps(step)}]")
            for step in self.steps
        ).removeprefix(".")
        return {"value": path, "len": f"len({path})", "name": f"{path}~"}[self.read]


@dataclass(frozen=True)
class FigureRow:
    """One row of a figures table, as written, with its cells by column."""

    doc: str
    line: int
    text: str
    cells: tuple[tuple[str, int, str], ...]  # (column, where the cell starts in the row, the cell)

    @classmethod
    def read(cls, doc: str, line: int, text: str, header: list[str]) -> FigureRow:
        spans = _cell_spans(text)
        return cls(doc, line, text, tuple((column, start, cell) for column, (start, cell) in zip(header, spans)))

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def columns(self) -> list[str]:
        return [column for column, _, _ in self.cells]

    def cell(self, column: str) -> str:
        return next((cell for name, _, cell in self.cells if name == column), "")


@functools.cache
def _cell_spans(row: str) -> tuple[tuple[int, str], ...]:
    """The cells of a table row as (where the cell starts in the row, the cell); a ``|`` inside a
    code span does not split. Cached, as ``_quoted``: the test that changes figures one by one reads
    each document again for every figure, and all but one of its lines are the same each time."""
    start = len(row) - len(row.lstrip())
    body = row.strip()
    if body.startswith("|"):
        body, start = body[1:], start + 1
    if body.endswith("|"):
        body = body[:-1]
    borders = [match.start() for match in CELL_BORDER.finditer(body) if match.group(1)]
    cells = []
    for begin, stop in zip([0, *(border + 1 for border in borders)], [*borders, len(body)]):
        raw = body[begin:stop]
        cells.append((start + begin + len(raw) - len(raw.lstrip()), raw.strip()))
    return tuple(cells)


def _cells(row: str) -> list[str]:
    """The cells of a table row; a ``|`` inside a code span does not split."""
    return [cell for _, cell in _cell_spans(row)]


def _tables(lines: list[tuple[int, str]]) -> tuple[list[tuple[list[str], list[tuple[int, str]]]], list]:
    """The tables among ``lines`` as (header, [(line number, row)]), and the lines outside them."""
    tables, outside, index = [], [], 0
    while index < len(lines):
        number, line = lines[index]
        if line.lstrip().startswith("|"):
            block = []
            while index < len(lines) and lines[index][1].lstrip().startswith("|"):
                block.append(lines[index])
                index += 1
            tables.append(([cell.lower() for cell in _cells(block[0][1])], block[2:]))
        else:
            outside.append((number, line))
            index += 1
    return tables, outside


def _blank(match: re.Match[str]) -> str:
    return " " * len(match.group(0))


def _link_text(match: re.Match[str]) -> str:
    """A link's text where the link stood, the rest blanked, so that offsets still hold."""
    return " " + match.group(1) + " " * (len(match.group(0)) - len(match.group(1)) - 1)


@functools.cache
def _quoted(text: str) -> tuple[Figure, ...]:
    """The figures of ``text``: its numbers outside code spans, comments, links' targets and names."""
    text = CODE_SPAN.sub(_blank, HTML_COMMENT.sub(_blank, text))
    text = NAME.sub(_blank, LINK.sub(_link_text, text))
    found = []
    for match in NUMBER.finditer(text):
        digits, fraction = match.group(1).replace(",", ""), match.group(2) or ""
        rest = text[match.end() :]
        unit = UNIT.match(rest)
        if rest[:1].isalpha() and unit is None:
            continue  # part of a name: 8B, 2nd
        if fraction:
            half = 0.5 * 10.0 ** -(len(fraction) - 1)
        else:
            zeros = len(digits) - len(digits.rstrip("0")) if digits.strip("0") else 0
            half = 0.5 * 10.0**zeros
        value = float(digits + fraction)
        found.append(Figure(match.group(0), value, half, unit.group(1) if unit else None, match.start(), match.end()))
    return tuple(found)


def _row_figures(row: FigureRow) -> list[Figure]:
    """The figures of a row's checked cells, their offsets taken in the row as written."""
    figures = []
    for column, start, cell in row.cells:
        if column not in SKIPPED_COLUMNS:
            figures += [figure._replace(start=start + figure.start, end=start + figure.end) for figure in _quoted(cell)]
    return figures


def _parse_fields(listing: str) -> list[Field]:
    """The fields of a ``<!-- fields: ... -->`` comment, relative paths resolved; ValueError if one
    cannot be read."""
    fields: list[Field] = []
    for entry in filter(None, (part.strip() for part in re.split(r",(?![^\[]*\])", listing))):
        read, path = "value", entry
        if path.startswith("len(") and path.endswith(")"):
            read, path = "len", path[4:-1]
        elif path.endswith("~"):
            read, path = "name", path[:-1]
        relative = path.startswith(".")
        path = path if relative or path.startswith("[") else "." + path
        steps: list[str | int] = []
        at = 0
        while at < len(path):
            step = PATH_STEP.match(path, at)
            if step is None:
                raise ValueError(f"cannot read field {entry!r}")
            name, index, quoted = step.groups()
            steps.append(name if name is not None else int(index) if index is not None else json.loads(quoted))
            at = step.end()
        if relative:
            if not fields:
                raise ValueError(f"{entry!r} continues no field before it")
            steps = [*fields[-1].steps[:-1], *steps]
        fields.append(Field(tuple(steps), read))
    return fields


@functools.cache
def _result(path: Path) -> object:
    return json.loads(path.read_text(encoding="utf-8"))


def _numbers_of(data: object, field: Field) -> list[float] | str:
    """The numbers ``field`` holds in ``data``, or why it holds none."""
    node = data
    for step in field.steps:
        if isinstance(step, int) and isinstance(node, list) and step < len(node):
            node = node[step]
        elif isinstance(step, str) and isinstance(node, dict) and step in node:
            node = node[step]
        else:
            return "is no field of the result"
    if field.read == "len":
        return [float(len(node))] if isinstance(node, (list, dict)) else "is neither a list nor an object"
    if field.read == "name":
        node = str(field.steps[-1])
    if isinstance(node, bool) or node is None:
        return f"holds {json.dumps(node)}, not a number"
    if isinstance(node, (int, float)):
        return [float(node)]
    if isinstance(node, str):
        return [float(token) for token in NUMBER_IN_TEXT.findall(node.replace(",", ""))]
    return "holds a list or an object, not a number"


def _found(numbers: list[float], figure: Figure) -> bool:
    for scale in SCALES[figure.unit]:
        target = figure.value * scale
        slack = figure.half * scale + 1e-9 * max(1.0, abs(target))
        if any(abs(number - target) <= slack for number in numbers):
            return True
    return False


@functools.cache
def _row_problems(row: FigureRow) -> tuple[str, ...]:
    """What is wrong with one figure row: no result or no fields named, a field missing, or a
    figure that is not the value of its field. Cached: a row's text decides it (the result files
    do not change while the tests run), and the test that changes figures one by one re-checks
    every row of a document each time."""
    where = row.where
    results = RESULT.findall(row.cell("result"))
    if len(results) != 1:
        return (f"{where}: names {len(results)} result files, not one",)
    path = REPO / results[0]
    if not path.is_file():
        return (f"{where}: {results[0]} is not in the repository",)
    listings = [listing for _, _, cell in row.cells for listing in FIELDS.findall(cell)]
    if len(listings) != 1:
        return (f"{where}: names {len(listings)} field lists (<!-- fields: PATH, ... -->), not one",)
    try:
        fields = _parse_fields(listings[0])
    except ValueError as error:
        return (f"{where}: {error}",)
    figures = _row_figures(row)
    if len(figures) != len(fields):
        shown = ", ".join(figure.shown(row.text) for figure in figures)
        return (f"{where}: {len(figures)} figures ({shown}) but {len(fields)} fields",)
    data = _result(path)
    problems = []
    for figure, field in zip(figures, fields, strict=True):
        numbers = _numbers_of(data, field)
        if isinstance(numbers, str):
            problems.append(f"{where}: {figure.shown(row.text)}: {field} {numbers}")
        elif not _found(numbers, figure):
            held = ", ".join(f"{number:g}" for number in numbers) or "no number"
            problems.append(f"{where}: {figure.shown(row.text)} is not {field} ({held})")
    return tuple(problems)


def _figure_lines(doc: Path, text: str) -> list[tuple[int, str]]:
    """The lines of ``doc`` that hold figures: README's "Main figures" section, all of the others."""
    lines = _prose(text)
    if doc != README:
        return lines
    start = next(i for i, (_, line) in enumerate(lines) if line.strip() == f"## {FIGURES_HEADING}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][1].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def _figure_rows(doc: Path, text: str) -> tuple[list[FigureRow], list[str]]:
    """Each figure row of ``doc`` (written as ``text``), and the problems of the layout itself."""
    tables, outside = _tables(_figure_lines(doc, text))
    problems = [
        f"{doc.name}:{number}: a number outside a figures table ({', '.join(q.written for q in quoted)})"
        for number, line in outside
        if (quoted := _quoted(line))
    ]
    rows = []
    for header, body in tables:
        if "result" not in header:
            problems.append(f"{doc.name}: a table without a result column: {header}")
            continue
        rows += [FigureRow.read(doc.name, number, line, header) for number, line in body]
    return rows, problems


def _figure_problems(doc: Path, text: str) -> list[str]:
    """The check itself, on the text of ``doc``: its layout, then every row's figures."""
    rows, problems = _figure_rows(doc, text)
    return problems + [problem for row in rows for problem in _row_problems(row)]


def _all_figure_rows() -> tuple[list[FigureRow], list[str]]:
    rows, problems = [], []
    for doc in FIGURE_DOCS:
        doc_rows, doc_problems = _figure_rows(doc, doc.read_text(encoding="utf-8"))
        rows, problems = rows + doc_rows, problems + doc_problems
    return rows, problems


def test_the_readme_and_the_benchmarks_page_quote_figures() -> None:
    rows, _ = _all_figure_rows()
    assert sum(row.doc == "README.md" for row in rows) >= 3
    assert sum(row.doc == "benchmarks.md" for row in rows) >= 10


def test_figures_stand_in_tables_that_name_their_result() -> None:
    _, problems = _all_figure_rows()
    assert not problems, "\n".join(problems)


def test_every_quoted_figure_is_the_named_field_of_the_result_its_row_names() -> None:
    rows, _ = _all_figure_rows()
    wrong = [problem for row in rows for problem in _row_problems(row)]
    assert not wrong, "\n".join(wrong)


def _moved(digit: str) -> str:
    """A last digit moved by two: by one, a value exactly halfway between two roundings (0.7605,
    quoted 0.760 or 0.761) would still match; never to 0, which would change the rounding shown."""
    return str(int(digit) + 2 if int(digit) < 8 else int(digit) - 2)


def test_a_figure_changed_in_its_last_digit_is_reported() -> None:
    """No figure passes on a field that would accept another value: moving the last digit of any one
    figure, in a copy of its document, makes the check report that figure."""
    unnoticed, changed = [], 0
    for doc in FIGURE_DOCS:
        text = doc.read_text(encoding="utf-8")
        lines = text.split("\n")
        rows, _ = _figure_rows(doc, text)
        for row in rows:
            assert lines[row.line - 1] == row.text
            for figure in _row_figures(row):
                at = figure.end - 1
                row_text = row.text[:at] + _moved(row.text[at]) + row.text[at + 1 :]
                copy = "\n".join([*lines[: row.line - 1], row_text, *lines[row.line :]])
                wrong = f"{row.where}: {figure.shown(row_text)}"
                if not any(problem.startswith(wrong) for problem in _figure_problems(doc, copy)):
                    unnoticed.append(f"{wrong} (was {figure.shown(row.text)})")
                changed += 1
    assert changed >= 300
    assert not unnoticed, "changed, yet not reported:\n" + "\n".join(unnoticed)


MAIN_JOB = "benchmarks/results/main_job_summary.json"


def _row(figure: str, fields: str, result: str = MAIN_JOB) -> FigureRow:
    text = f"| {figure} | [summary]({result}) <!-- fields: {fields} --> |"
    return FigureRow.read("example", 1, text, ["figure", "result"])


def test_a_figure_that_is_not_its_named_field_is_reported() -> None:
    """Against the committed main job's result, whatever its figures are when it is re-run."""
    run = json.loads((REPO / MAIN_JOB).read_text())
    base, mean = run["base_accuracy"], run["final_mean_of_last_two"]
    versions, wall = run["versions"], f"{run['wall_seconds']:.0f} s"
    # An evaluation in the file that is not the mean of the last two (the last one, where they differ).
    evaluations = [run["final_accuracy"], *run["accuracy_by_version"].values()]
    last = next(value for value in evaluations if f"{value:.3f}" != f"{mean:.3f}")
    fields = "base_accuracy, final_mean_of_last_two, versions, wall_seconds"
    assert _row_problems(_row(f"EM {base:.2f} → {mean:.3f} in {versions} versions and {wall}", fields)) == ()
    wrong = 0.97 if abs(mean - 0.97) > 0.01 else 0.5
    assert _row_problems(_row(f"EM {base:.2f} → {wrong} in {versions} versions and {wall}", fields)) == (
        f"example:1: {wrong} is not final_mean_of_last_two ({mean})",
    )
    # In the file (an evaluation), but not the field the row names: the old check passed it.
    assert _row_problems(_row(f"EM {base:.2f} → {last:.3f} in {versions} versions and {wall}", fields)) == (
        f"example:1: {last:.3f} is not final_mean_of_last_two ({mean})",
    )
    assert _row_problems(_row(f"EM {base:.2f} → {mean:.3f} in {versions} versions", fields)) == (
        f"example:1: 3 figures ({base:.2f}, {mean:.3f}, {versions}) but 4 fields",
    )
    assert _row_problems(_row(wall, "wall_secs")) == (f"example:1: {wall}: wall_secs is no field of the result",)
    assert _row_problems(_row(wall, "provenance")) == (
        f"example:1: {wall}: provenance holds a list or an object, not a number",
    )
    assert _row_problems(_row("0.5", "x", result="")) == ("example:1: names 0 result files, not one",)
    text = f"| 0.5 | {MAIN_JOB} |"
    no_fields = FigureRow.read("example", 1, text, ["figure", "result"])
    assert _row_problems(no_fields) == ("example:1: names 0 field lists (<!-- fields: PATH, ... -->), not one",)


def test_fields_are_read_as_paths() -> None:
    fields = _parse_fields('runs[1].result.solver.base, .gain, engines["openai/vllm"].x, len(rates.1), t.a_80pct~')
    assert [str(field) for field in fields] == [
        "runs[1].result.solver.base",
        "runs[1].result.solver.gain",
        'engines["openai/vllm"].x',
        "len(rates.1)",
        "t.a_80pct~",
    ]
    data = {"t": {"a_80pct": True}, "rates": {"1": [3, 4, 5]}, "run": "3node-secure", "flag": True}
    assert _numbers_of(data, fields[4]) == [80.0]
    assert _numbers_of(data, fields[3]) == [3.0]
    assert _numbers_of(data, Field(("run",), "value")) == [3.0]
    assert _numbers_of(data, Field(("flag",), "value")) == "holds true, not a number"
    with pytest.raises(ValueError):
        _parse_fields(".gain")
    with pytest.raises(ValueError):
        _parse_fields("runs[x]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.54x and 72 MB/s", [("0.54", 0.54, 0.005, "x"), ("72", 72.0, 0.5, "MB")]),
        ("22,460 records/s", [("22,460", 22460.0, 5.0, None)]),
        ("138.8k rollouts, 89%", [("138.8", 138.8, 0.05, "k"), ("89", 89.0, 0.5, "%")]),
        ("Qwen2 and bf16 and p99 and `--minutes 8`", []),
        ("ZeRO-3 of a Qwen2-0.5B-shaped model, 8-GPU <!-- fields: a[2] -->", [("8", 8.0, 0.5, None)]),
        (
            "[0.5x](#weights) and 10-12.6k/s",
            [("0.5", 0.5, 0.05, "x"), ("10", 10.0, 5.0, None), ("12.6", 12.6, 0.05, "k")],
        ),
    ],
)
def test_numbers_are_read_as_written(text: str, expected: list) -> None:
    assert [tuple(figure[:4]) for figure in _quoted(text)] == expected


def test_a_figure_is_shown_with_its_unit_and_found_where_it_stands() -> None:
    text = "| in 330 versions and 268 s, 0.54x | result |"
    row = FigureRow.read("example", 1, text, ["figure", "result"])
    assert [figure.shown(text) for figure in _row_figures(row)] == ["330", "268 s", "0.54x"]


def test_each_row_names_a_commit_that_changed_its_result() -> None:
    if _git("rev-parse", "--is-shallow-repository") != "false\n":
        pytest.skip("needs a git checkout with its full history")
    rows, _ = _all_figure_rows()
    wrong = []
    for row in rows:
        if "commit" not in row.columns:
            continue
        commits = COMMIT.findall(row.cell("commit"))
        result = RESULT.findall(row.cell("result"))
        history = (_git("log", "--format=%H", "--", *result) or "").split()
        if len(commits) != 1 or not any(full.startswith(commits[0]) for full in history):
            wrong.append(f"{row.where}: {row.cell('commit')} is not a commit that changed {result}")
    assert not wrong, "\n".join(wrong)


README_MAX_LINES, README_MAX_WORDS = 180, 1800
"""The README's size: the set-up, the quickstart, the main figures; the rest is in docs/."""


def test_the_readme_stays_short() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md: move detail to docs/"
    assert len(text.split()) <= README_MAX_WORDS, f"README.md has {len(text.split())} words: move detail to docs/"
