"""The package's rooms import each other without a cycle: every import of core and the built-in
plugins, relative or absolute, deferred imports inside functions included (an import cycle held
apart by deferring one side is still a cycle); only imports for annotations (``if TYPE_CHECKING:``)
are left out, since they never run. And core's folders are the layers ``docs/layout.md`` names."""

import ast
import graphlib
import re
from pathlib import Path

import pytest

CORE = Path(__file__).parents[1] / "core"
LAYOUT = Path(__file__).parents[1] / "docs" / "layout.md"
PACKAGE_ROOTS = ((CORE, "accelbench"), (CORE.parent / "plugins", "accelbench.plugins"))


def installed_names(roots=PACKAGE_ROOTS) -> dict[str, Path]:
    """Every module of the package by its installed name: core/ is ``accelbench``, plugins/ is
    ``accelbench.plugins`` (a package's ``__init__`` by the package's name)."""
    found = {}
    for top, prefix in roots:
        for path in top.rglob("*.py"):
            parts = list(path.relative_to(top).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join([prefix, *parts])] = path
    return found


def package_graph(roots=PACKAGE_ROOTS) -> dict[str, set[str]]:
    """Who imports whom across core and the built-in plugins, relative and absolute imports alike
    (deferred ones included, annotations-only ones left out)."""
    names = installed_names(roots)
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
            if id(node) in annotations_only:
                continue
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(filter(None, (base, node.module)))
            for alias in node.names:  # ``from a import x`` may name a module; ``from a.x import y`` a name in one
                targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in names else module)
        graph[name] = {t for t in targets if t in names and t != name and not name.startswith(t + ".")}
    return graph


def test_core_and_the_plugins_have_no_import_cycle():
    """Plugins too: mxnet_ngc's oneDNN module and its training module, and the TensorFlow
    plugins' common and train-mode modules, imported each other (one side deferred) until
    2026-12-06."""
    graph = package_graph()
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}")
    assert "accelbench.plugins.shared.tf_common" in graph["accelbench.plugins.shared.tf_training"]
    assert "accelbench.plugins.mxnet_ngc.onednn" in graph["accelbench.plugins.mxnet_ngc.training"]
    # core's absolute imports are read too: the runner imports the worker processes' module
    assert "accelbench.execution.processes" in graph["accelbench.execution.runner"]


def test_the_checker_sees_a_cycle_a_deferred_import_would_hide(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def later():\n    from pkg.a import thing\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n")
    graph = package_graph(((package, "pkg"),))
    assert {name: graph[name] for name in ("pkg.a", "pkg.b", "pkg.c")} == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": set()}
    with pytest.raises(graphlib.CycleError):
        list(graphlib.TopologicalSorter(graph).static_order())


def core_folders() -> list[Path]:
    return sorted(p for p in CORE.iterdir() if (p / "__init__.py").is_file() and p.name != "benchmarks")


def test_core_is_in_the_sub_packages_the_layout_page_names():
    """Each layer is a folder of core, and docs/layout.md names every module of it by its path in
    core (``execution/runner.py``); a path the page names exists. Only the public surface and the
    plugin host stand at the top."""
    page = LAYOUT.read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)?[a-z_]+\.py)`", page))
    modules = {str(p.relative_to(CORE)) for folder in core_folders() for p in folder.glob("*.py") if p.name != "__init__.py"}
    top = {p.name for p in CORE.glob("*.py")}
    assert modules - named == set(), "modules the layout page does not name"
    layers = {folder.name for folder in core_folders()}
    assert modules >= {n for n in named if n.split("/")[0] in layers}, "paths the layout page names that are not there"
    assert top <= named | {"__init__.py", "__main__.py"}
    assert top <= {"__init__.py", "__main__.py", "api.py", "hookspecs.py", "errors.py", "backend.py", "launch.py", "registry.py"}
    assert len(core_folders()) >= 6


def stem(name: str) -> str:
    return name.split("_")[0].removesuffix("s")


def test_no_two_modules_side_by_side_have_names_a_reader_confuses():
    """worker.py beside workers.py, environment.py beside envs.py, peaks.py beside
    peak_measure.py: siblings whose first word is the same, or one a shortening of the other."""
    confusable = []
    for folder in [CORE, *core_folders()]:
        names = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("__"))
        names += sorted(p.name for p in folder.iterdir() if (p / "__init__.py").is_file())
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if stem(a).startswith(stem(b)) or stem(b).startswith(stem(a)):
                    confusable.append(f"{folder.name}/{a} and {b}")
    assert confusable == []
    assert stem("workers") == stem("worker") and stem("envs") in stem("environment") and stem("peak_measure") == stem("peaks")


def test_every_room_says_what_it_holds():
    """Each module opens with a docstring (the room's job), as the layout page lists them."""
    missing = [
        path.name
        for path in sorted(CORE.rglob("*.py"))
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


def string_key_subscripts(root: Path) -> list[str]:
    """Every ``x["key"]`` in a folder's code: a dict read by string keys, where a typed record would
    name its fields (annotations such as ``Request["Prepared"]`` count too: write the type)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if "benchmarks" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_core_reads_few_dicts_by_string_keys():
    """Records, manifests, catalogues and the study's figures are dataclasses read through
    ``jsonform``; what is left is JSON on its way in (a config before it is validated, a schema)."""
    found = string_key_subscripts(CORE)
    assert len(found) <= 80, "\n".join(found)
    records = [line for line in string_key_subscripts(CORE / "records") if not line.startswith("validation.py")]
    assert records == [], "the records are typed end to end (the schemas, JSON themselves, aside)"


def test_the_paths_the_docs_import_from_still_import():
    """Core moved into folders; what the docs tell a user or a plugin author to import did not."""
    import importlib

    from accelbench.records import Record, read_results
    from accelbench.records.results import Record as RecordItself
    from accelbench.records.results import read_results as read_results_itself

    assert (Record, read_results) == (RecordItself, read_results_itself)
    for module, name in [("accelbench.api", "cpu_flags"), ("accelbench.launch", "Engine"), ("accelbench", "Backend")]:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"
    with pytest.raises(ImportError):
        from accelbench.records import nothing_of_that_name  # noqa: F401
