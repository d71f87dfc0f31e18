"""Plugins and their environments: ``plugins``, ``new-plugin`` and ``env create/list/remove``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from accelbench.cli.app import cli
from accelbench.errors import UsageError


@cli.command()
def plugins() -> None:
    """List plugins and their backends as JSON (no framework is imported)."""
    from accelbench.registry import PluginHost

    host = PluginHost()
    backends = host.backends()
    listing = []
    for plugin in host.plugins():
        entries = []
        for ref in (r for r in backends if r.plugin.name == plugin.name):
            reason = ref.unavailable_reason()
            engine = ref.backend.engine
            entries.append(
                {
                    "id": ref.id,
                    **ref.backend.describe().to_json(),
                    "engine": engine.name if engine else None,
                    "available": reason is None,
                    "reason": reason or "",
                }
            )
        listing.append(
            {"name": plugin.name, "version": plugin.version, "module": plugin.module, "error": plugin.error, "backends": entries}
        )
    click.echo(json.dumps(listing, indent=2))


@cli.group()
def env() -> None:
    """Worker environments: one per distinct requirement set, made on first use and cached."""


@env.command("create")
@click.option(
    "--plugin", "plugin_names", multiple=True, help="Only these plugins (default: every one that declares an environment)."
)
@click.option("--env", "env_matrix", multiple=True, metavar="REQUIREMENTS", help="Requirements added (as accelbench run --env).")
def env_create(plugin_names: tuple[str, ...], env_matrix: tuple[str, ...]) -> None:
    """Make the environments the selected plugins' backends run in."""
    from accelbench.environments import python_envs as envs
    from accelbench.registry import PluginHost

    matrix = [envs.parse_requirements(e) for e in env_matrix]
    refs = PluginHost().select(plugin_names)
    wanted = {s.spec for r in refs for s in envs.setups_for(r, {}, matrix) if s.spec is not None}
    if not wanted:
        raise UsageError("no selected backend declares an environment (give --env to make one)")
    failed = 0
    for spec in wanted:
        env = envs.for_spec(spec)
        try:
            envs.ensure(env, True, lambda text: click.echo(text, err=True))
            click.echo(f"{env.path}: {', '.join(spec.requirements)}")
        except envs.EnvironmentNotMade as exc:
            failed += 1
            click.echo(f"error: {exc}", err=True)
    sys.exit(1 if failed else 0)


@env.command("list")
def env_list() -> None:
    """The cached environments: path, Python, requirements, size."""
    from accelbench.environments import python_envs as envs

    for entry in envs.listing():
        made = entry.manifest
        installed = ", ".join(f"{name} {version}" for name, version in made.installed.items())
        serves = f"  plugin {made.spec.plugin_version}" if made.spec.plugin_version else ""
        click.echo(
            f"{entry.path}  python {entry.python}  {entry.size_mb} MB  "
            f"{', '.join(made.spec.requirements) or '-'}{serves}  [{installed or 'versions not recorded'}]"
        )


@env.command("remove")
@click.argument("keys", nargs=-1)
def env_remove(keys: tuple[str, ...]) -> None:
    """Delete cached environments (these keys, or every one)."""
    from accelbench.environments import python_envs as envs

    for path in envs.remove(tuple(keys)):
        click.echo(f"removed {path}")


@cli.command("new-plugin")
@click.argument("name")
@click.option(
    "--framework",
    metavar="PKG",
    help="The distribution the plugin's framework comes from: the backend "
    "declares it as its worker environment (a Python of its own).",
)
@click.option("--dir", "folder", type=click.Path(file_okay=False), help="Where to write it (default ./accelbench-NAME).")
def new_plugin(name: str, framework: str | None, folder: str | None) -> None:
    """Write a minimal plugin distribution NAME to start from: pyproject.toml with the entry
    point, a backend, a contract test and a README; `pip install -e .` and `pytest` pass as it is."""
    from accelbench.authoring import scaffold

    target = Path(folder or f"accelbench-{name.replace('_', '-')}")
    for path in scaffold.write(name, target, framework):
        click.echo(f"wrote {path}")
    click.echo(f"next: cd {target} && pip install -e '.[test]' && pytest && accelbench run --plugin {name}")
