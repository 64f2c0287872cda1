"""The repository explains itself (issue #19): it points nowhere outside itself, its links resolve,
and every figure it quotes is in the committed result its row names.

Figures live in tables: the one under "Main figures" in README.md and every table of
docs/benchmarks.md. A row names its result file (``benchmarks/results/NAME.json``); every number
in the row's other cells (code spans, the command and the commit left out) must appear in that
file - as a value, or inside one of its keys or strings - rounded as the row shows it. A unit
after the number rescales it (``%``, ``k``, ``M``, ``MiB``, ``MB``, ``GB``, ``ms`` ...). Outside
those tables the figures sections hold no numbers at all, so none escapes the check.
"""

from __future__ import annotations

import bisect
import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted((REPO / "docs").glob("*.md"))
MARKDOWN = [REPO / "README.md", *DOCS]
BENCHMARKS_DOC = REPO / "docs" / "benchmarks.md"
FIGURES_HEADING = "Main figures"
# Guidance kept outside the repository; spelled in pieces so that this file does not name them.
OUTSIDE = tuple(name + ".md" for name in ("DESIGN", "ALGORITHMS", "PERFORMANCE")) + (".." + "/shared",)

CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
RESULT = re.compile(r"benchmarks/results/[\w.-]+\.json")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?")
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


# --- (c) figures come from committed results --------------------------------------------------


def _cells(row: str) -> list[str]:
    """The cells of a table row; a ``|`` inside a code span does not split."""
    cells, current, in_code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(current.strip())
            current = ""
        else:
            current += ch
    return [*cells, current.strip()]


def _tables(lines: list[tuple[int, str]]) -> tuple[list[tuple[list[str], list[tuple[int, list[str]]]]], list]:
    """The tables among ``lines`` as (header, [(line number, cells)]), and the lines outside them."""
    tables, outside, index = [], [], 0
    while index < len(lines):
        number, line = lines[index]
        if line.lstrip().startswith("|"):
            block = []
            while index < len(lines) and lines[index][1].lstrip().startswith("|"):
                block.append(lines[index])
                index += 1
            header = [cell.lower() for cell in _cells(block[0][1])]
            tables.append((header, [(n, _cells(text)) for n, text in block[2:]]))
        else:
            outside.append((number, line))
            index += 1
    return tables, outside


def _quoted(text: str) -> list[tuple[str, float, float, str | None]]:
    """The numbers of ``text`` outside code spans: (as written, value, half its last digit, unit)."""
    text = LINK.sub(r"\1", CODE_SPAN.sub(" ", text))
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
        found.append((match.group(0), float(digits + fraction), half, unit.group(1) if unit else None))
    return found


@functools.cache
def _result_numbers(path: Path) -> list[float]:
    """Every number of a result file, sorted: values, and numbers written inside keys and strings."""
    numbers: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, bool) or node is None:
            return
        if isinstance(node, (int, float)):
            numbers.append(float(node))
        elif isinstance(node, str):
            numbers.extend(float(token) for token in re.findall(r"\d+(?:\.\d+)?", node.replace(",", "")))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(key)
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(path.read_text(encoding="utf-8")))
    return sorted(numbers)


def _found(numbers: list[float], value: float, half: float, unit: str | None) -> bool:
    for scale in SCALES[unit]:
        target, slack = value * scale, half * scale + 1e-9 * max(1.0, abs(value * scale))
        at = bisect.bisect_left(numbers, target - slack)
        if at < len(numbers) and numbers[at] <= target + slack:
            return True
    return False


def _figure_rows(doc: Path, lines: list[tuple[int, str]]) -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    """Each figure row as (where, {column: cell}), and the problems of the layout itself."""
    tables, outside = _tables(lines)
    problems = [
        f"{doc.name}:{number}: a number outside a figures table ({', '.join(q[0] for q in quoted)})"
        for number, line in outside
        if (quoted := _quoted(line))
    ]
    rows = []
    for header, body in tables:
        if "result" not in header:
            problems.append(f"{doc.name}: a table without a result column: {header}")
            continue
        rows += [(f"{doc.name}:{number}", dict(zip(header, cells))) for number, cells in body]
    return rows, problems


def _readme_figures() -> list[tuple[int, str]]:
    lines = _prose((REPO / "README.md").read_text(encoding="utf-8"))
    start = next(i for i, (_, line) in enumerate(lines) if line.strip() == f"## {FIGURES_HEADING}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i][1].startswith("## ")), len(lines))
    return lines[start + 1 : end]


def _all_figure_rows() -> tuple[list[tuple[str, dict[str, str]]], list[str]]:
    readme_rows, readme_problems = _figure_rows(REPO / "README.md", _readme_figures())
    doc_rows, doc_problems = _figure_rows(BENCHMARKS_DOC, _prose(BENCHMARKS_DOC.read_text(encoding="utf-8")))
    return readme_rows + doc_rows, readme_problems + doc_problems


def _unsupported(where: str, row: dict[str, str]) -> list[str]:
    """What is wrong with one figure row: no result named, or numbers the result does not hold."""
    results = RESULT.findall(row.get("result", ""))
    if len(results) != 1:
        return [f"{where}: names {len(results)} result files, not one"]
    path = REPO / results[0]
    if not path.is_file():
        return [f"{where}: {results[0]} is not in the repository"]
    numbers = _result_numbers(path)
    text = " | ".join(cell for column, cell in row.items() if column not in SKIPPED_COLUMNS)
    return [
        f"{where}: {written} is not in {results[0]}"
        for written, value, half, unit in _quoted(text)
        if not _found(numbers, value, half, unit)
    ]


def test_the_readme_and_the_benchmarks_page_quote_figures() -> None:
    rows, _ = _all_figure_rows()
    assert sum(where.startswith("README.md") for where, _ in rows) >= 3
    assert sum(where.startswith("benchmarks.md") for where, _ in rows) >= 10


def test_figures_stand_in_tables_that_name_their_result() -> None:
    _, problems = _all_figure_rows()
    assert not problems, "\n".join(problems)


def test_every_quoted_figure_is_in_the_committed_result_its_row_names() -> None:
    rows, _ = _all_figure_rows()
    missing = [problem for where, row in rows for problem in _unsupported(where, row)]
    assert not missing, "\n".join(missing)


def test_a_figure_missing_from_its_result_is_reported() -> None:
    row = {"figure": "held-out EM 0.38 → 0.93 in 330 versions", "result": "benchmarks/results/main_job_summary.json"}
    assert _unsupported("example", row) == []
    assert _unsupported("example", {**row, "figure": "held-out EM 0.38 → 0.97"}) == [
        "example: 0.97 is not in benchmarks/results/main_job_summary.json"
    ]
    assert _unsupported("example", {"figure": "0.5", "result": ""}) == ["example: names 0 result files, not one"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.54x and 72 MB/s", [("0.54", 0.54, 0.005, "x"), ("72", 72.0, 0.5, "MB")]),
        ("22,460 records/s", [("22,460", 22460.0, 5.0, None)]),
        ("138.8k rollouts, 89%", [("138.8", 138.8, 0.05, "k"), ("89", 89.0, 0.5, "%")]),
        ("Qwen2 and bf16 and p99 and `--minutes 8`", []),
    ],
)
def test_numbers_are_read_as_written(text: str, expected: list) -> None:
    assert _quoted(text) == expected


def test_each_row_names_a_commit_that_changed_its_result() -> None:
    if _git("rev-parse", "--is-shallow-repository") != "false\n":
        pytest.skip("needs a git checkout with its full history")
    rows, _ = _all_figure_rows()
    wrong = []
    for where, row in rows:
        if "commit" not in row:
            continue
        commits = COMMIT.findall(row["commit"])
        result = RESULT.findall(row.get("result", ""))
        history = (_git("log", "--format=%H", "--", *result) or "").split()
        if len(commits) != 1 or not any(full.startswith(commits[0]) for full in history):
            wrong.append(f"{where}: {row['commit']} is not a commit that changed {result}")
    assert not wrong, "\n".join(wrong)
