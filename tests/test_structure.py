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
    annotations_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
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


def installed_names() -> dict[str, Path]:
    """Every module of the package by its installed name: core/ is ``accelbench``, plugins/ is
    ``accelbench.plugins`` (a package's ``__init__`` by the package's name)."""
    found = {}
    for top, prefix in ((CORE, "accelbench"), (CORE.parent / "plugins", "accelbench.plugins")):
        for path in top.rglob("*.py"):
            parts = list(path.relative_to(top).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join([prefix, *parts])] = path
    return found


def package_graph() -> dict[str, set[str]]:
    """Who imports whom across core and the built-in plugins, relative and absolute imports alike
    (deferred ones included, annotations-only ones left out)."""
    names = installed_names()
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        annotations_only = {
            id(node)
            for branch in ast.walk(tree)
            if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
            for node in ast.walk(branch)
        }
        targets = set()
        for node in ast.walk(tree):
            if id(node) in annotations_only or not isinstance(node, ast.ImportFrom):
                continue
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            for alias in node.names:  # ``from . import x`` names a module; ``from .x import y`` a name in one
                targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in names else module)
        graph[name] = {t for t in targets if t in names and t != name and not name.startswith(t + ".")}
    return graph


def test_core_and_the_plugins_have_no_import_cycle():
    """Plugins too: mxnet_ngc's oneDNN module and its training module, and the TensorFlow
    plugins' common and train-mode modules, imported each other (one side deferred) until
    2026-12-06."""
    try:
        list(graphlib.TopologicalSorter(package_graph()).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}")
    graph = package_graph()
    assert "accelbench.plugins.tf_common" in graph["accelbench.plugins.tf_training"]
    assert "accelbench.plugins.mxnet_ngc.onednn" in graph["accelbench.plugins.mxnet_ngc.training"]


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
    missing = [
        path.name
        for path in sorted(CORE.glob("*.py"))
        if path.name != "__main__.py" and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert missing == []
