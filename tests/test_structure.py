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
    assert "accelbench.plugins.shared.tf_common" in graph["accelbench.plugins.shared.tf_training"]
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


def test_no_class_name_is_defined_twice_in_core():
    """A reader (and a grep) finds one class per name: two ``Schedule`` classes made two modules
    import one under another name, and an ``EnvironmentError_`` needed a trailing underscore."""
    defined: dict[str, list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(path.name)
    twice = {name: where for name, where in defined.items() if len(where) > 1}
    assert not twice, twice
    assert not [name for name in defined if name.endswith("_")], "a class name that needs a trailing underscore"


BUILT_INS = ("tf_benchmarks", "mxnet_ngc", "tpu_official", "torch_ref", "jax_flax")


def test_a_built_in_imports_another_plugin_only_through_the_shared_package():
    def plugin_of(module: str) -> str | None:
        parts = module.split(".")
        return parts[2] if module.startswith("accelbench.plugins.") else None

    crossings = [
        (name, target)
        for name, targets in package_graph().items()
        for target in targets
        if plugin_of(name) in BUILT_INS and plugin_of(target) not in (None, "shared", plugin_of(name))
    ]
    assert crossings == []
    assert any(t.startswith("accelbench.plugins.shared.") for t in package_graph()["accelbench.plugins.tpu_official"])


@pytest.mark.parametrize("name", BUILT_INS)
def test_each_built_in_declares_the_plugin_api_it_was_written_for(name):
    import importlib

    from accelbench.api import PLUGIN_API

    declared = importlib.import_module(f"accelbench.plugins.{name}").PLUGIN_API
    assert declared.split(".")[0] == PLUGIN_API.split(".")[0], declared


def test_the_model_descriptions_stay_importable_where_the_docs_first_put_them():
    from accelbench.plugins.model_specs import RESNET50_VARIANTS as old
    from accelbench.plugins.shared.model_specs import RESNET50_VARIANTS as new

    assert old is new
