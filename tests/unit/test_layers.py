"""No two modules of ``astraflow`` import each other, directly or through others.

import-linter's contracts (pyproject.toml) keep packages in their layers; this keeps modules out of
cycles, inside a package too, and no module grows past ``MAX_MODULE_LINES``. Every import counts:
inside functions (a lazy import of our own module still ties two modules together) and under
``if TYPE_CHECKING:`` (a type-only import is still an arrow between two modules: a Protocol on the
importing side, or the type moved down, breaks it).
"""

from __future__ import annotations

from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[2] / "astraflow"
MAX_MODULE_LINES = 400


def import_cycles(graph: grimp.ImportGraph) -> list[tuple[str, str]]:
    """Every direct import ``a -> b`` where ``b`` also reaches ``a``: the imports that lie on a cycle."""
    return sorted(
        (importer, imported)
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if graph.chain_exists(importer=imported, imported=importer)
    )


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert import_cycles(graph) == [("a.b", "a.c"), ("a.c", "a.b")]


def test_no_module_of_astraflow_is_in_an_import_cycle() -> None:
    graph = grimp.build_graph("astraflow", exclude_type_checking_imports=False)
    assert import_cycles(graph) == []


def test_no_module_is_over_the_line_limit() -> None:
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert len(sizes) > 100, "the walk found too few modules"
    assert {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}


def test_the_package_map_in_the_docs_matches_the_layer_contract() -> None:
    """docs/architecture.md's package map names each package's layer as pyproject.toml's contract
    orders them: a package moved in one and not the other fails here."""
    import re
    import tomllib

    root = PACKAGE.parent
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    contract = {
        name.strip().removeprefix("astraflow."): index for index, row in enumerate(layers) for name in row.split("|")
    }
    section = (root / "docs" / "architecture.md").read_text().split("## Package layers", 1)[1]
    rows = re.findall(r"^\| `([\w/]+)/` \| (\w+) \|", section, flags=re.M)
    names = list(dict.fromkeys(layer for _, layer in rows if layer != "outside"))
    documented = {package.split("/")[0]: names.index(layer) for package, layer in rows if layer != "outside"}
    assert len(names) == len(layers) <= 8
    assert documented == contract
    on_disk = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()} - {"chaos"}
    assert set(contract) == on_disk, "every package is in exactly one layer"
