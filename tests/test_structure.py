"""The package's rooms import each other without a cycle: every ``from .x import`` and ``from .
import x`` of core, deferred imports inside functions included (an import cycle held apart by
deferring one side is still a cycle); only imports for annotations (``if TYPE_CHECKING:``) are
left out, since they never run."""

import ast
import graphlib
from pathlib import Path

import pytest

CORE = Path(__file__).parents[1] / "core"


def imports_of(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    annotations_only = {id(node) for branch in ast.walk(tree)
                        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
                        for node in ast.walk(branch)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in annotations_only or not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        found |= {node.module.split(".")[0]} if node.module else {alias.name for alias in node.names}
    return (found & modules) - {path.stem}


def core_graph() -> dict[str, set[str]]:
    modules = {path.stem for path in CORE.glob("*.py")}
    return {path.stem: imports_of(path, modules) for path in CORE.glob("*.py")}


def test_core_has_no_import_cycle():
    graph = core_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle among core's modules: {' -> '.join(cycle.args[1])}")
    assert set(order) == set(graph)


def test_the_checker_sees_a_cycle_a_deferred_import_would_hide(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def later():\n    from .a import thing\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n")
    modules = {"a", "b", "c"}
    graph = {name: imports_of(tmp_path / f"{name}.py", modules) for name in modules}
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())


def test_every_room_says_what_it_holds():
    """Each module opens with a docstring (the room's job), as the layout page lists them."""
    missing = [path.name for path in sorted(CORE.glob("*.py"))
               if path.name != "__main__.py" and not ast.get_docstring(ast.parse(path.read_text()))]
    assert missing == []
