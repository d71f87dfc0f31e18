"""``accelbench worker`` (the ranks one host runs in a multi-host job) and ``accelbench merge``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from accelbench.cli.app import cli
from accelbench.cli.options import config_options, endpoint, run_config, selected, slurm_options
from accelbench.errors import UsageError


@cli.command()
@config_options
@click.option(
    "--rank",
    type=int,
    help="This worker's rank, 0..workers-1 (with --local-workers N: the first of the N ranks this host runs; "
    "default: the launcher's, from its environment).",
)
@click.option("--workers", type=int, help="Workers in the job, across every host (default: the launcher's).")
@click.option(
    "--local-workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Ranks this host runs, --rank and the ones after it: one per device, as a launcher's nproc-per-node.",
)
@click.option(
    "--coordinator",
    help="HOST:PORT of the job's coordinator (a scheduler rank 0 starts, for engines with one; "
    "default: the launcher's first node or MASTER_ADDR:MASTER_PORT).",
)
@click.option(
    "--peers",
    help="Every worker's HOST:PORT, comma-separated, in rank order (engines that need it; default: from Slurm's nodes).",
)
@click.option(
    "--host", "node_host", help="This host's address as the other hosts reach it (engines that need it; default: this node's)."
)
@click.option("--service", help="A Kubernetes Indexed Job's headless Service, through which its pods reach each other.")
@click.option(
    "--servers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Service processes (e.g. parameter servers) rank 0 starts, for engines with them.",
)
@click.option(
    "--output", "-o", required=True, type=click.Path(dir_okay=False), help="This rank's results file ({rank}: the rank)."
)
def worker(
    rank: int | None,
    local_workers: int,
    coordinator: str | None,
    peers: str | None,
    node_host: str | None,
    service: str | None,
    servers: int,
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    config_file: str | None,
    options: tuple[str, ...],
    output: str,
    **flags: Any,
) -> None:
    """Run the ranks one host holds in a multi-host job; a cluster scheduler starts one per host.
    Under srun, torchrun, mpirun or a Kubernetes Indexed Job the ranks come from the launcher's
    environment (flags win, and must agree with it)."""
    import os

    from accelbench import launch
    from accelbench.execution import distributed, runner
    from accelbench.planning import launchers
    from accelbench.records import results as records

    placed = launchers.resolve(os.environ, rank, flags.get("workers"), coordinator, local_workers, service)
    coordinator, rank = placed.coordinator or "", placed.rank
    config = run_config(config_file, {**flags, "workers": placed.workers, "scaling_baseline": False}, options)
    refs = selected(plugin_names, backend_names)
    if len(refs) != 1:
        raise UsageError(f"a worker runs exactly one backend; selected {len(refs)}")
    [item] = runner.plan(refs, config)
    if item.precheck:
        raise UsageError(item.precheck.reason)
    endpoint(coordinator, "--coordinator")
    peer_list = tuple(peers.split(",")) if peers else placed.peers(local_workers)
    if peer_list and len(peer_list) != config.workers:
        raise UsageError(f"--peers names {len(peer_list)} workers but --workers is {config.workers}: one HOST:PORT a rank")
    for peer in peer_list:
        endpoint(peer, "--peers")
    cluster = launch.ClusterRank(
        rank,
        config.workers,
        coordinator,
        peer_list,
        node_host or placed.node_host,
        servers,
        local_rank=placed.local_rank,
        local_workers=local_workers,
        local_world_size=placed.local_world_size,
    )
    engine = refs[0].backend.engine
    if engine is None:  # planning refuses it for --workers > 1; a job of one worker needs an engine all the same
        raise UsageError(f"{refs[0].id} has no multi-worker engine: `accelbench worker` runs a rank of a multi-host job")
    plan = launch.plan_host(engine, cluster)
    record = distributed.run_rank(refs[0], item.config, plan, rank, placed.local_rank, placed.launcher)
    records.write_results(Path(output.replace("{rank}", str(rank))), [record])
    ranks = f"rank {rank}" if local_workers == 1 else f"ranks {rank}-{rank + local_workers - 1}"
    click.echo(f"{ranks} ({placed.launcher.name}): {record.status} {record.reason}".strip())
    sys.exit(0 if record.ok else 1)


@cli.command()
@click.argument("files", nargs=-1, required=True)
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="Merged results file.")
def merge(files: tuple[str, ...], output: str) -> None:
    """Merge the per-rank results files of one multi-host job into one record."""
    from accelbench.records import results as records

    merged = records.merge_ranks([r for name in files for r in records.read_results(name)])
    records.write_results(Path(output), [merged])
    click.echo(f"merged {len(merged.distributed.per_worker) if merged.distributed else 0} workers: {merged.status} -> {output}")


@cli.command("slurm-script")
@config_options
@slurm_options(for_run=False)
def slurm_script(
    nodes: int,
    tasks_per_node: int,
    partition: str | None,
    account: str | None,
    slurm_time: str | None,
    job_dir: str,
    plugin_names: tuple[str, ...],
    backend_names: tuple[str, ...],
    config_file: str | None,
    options: tuple[str, ...],
    **flags: Any,
) -> None:
    """Print the sbatch script of a multi-host run (what `run --slurm` submits), for users who
    submit their own: srun accelbench worker on every task, then accelbench merge."""
    from accelbench.execution import runner, slurm_jobs
    from accelbench.planning import inputs

    config = run_config(config_file, flags, options)
    refs = selected(plugin_names, backend_names)
    if len(refs) != 1:
        raise UsageError(f"a Slurm job runs exactly one backend; selected {len(refs)}: pick one with --backend")
    if refs[0].backend.engine is None:
        raise UsageError(f"{refs[0].id} has no multi-worker engine")
    [item] = runner.plan(refs, config)
    if item.precheck:
        raise UsageError(item.precheck.reason)
    folder = Path(job_dir)
    inputs.check_writable_folder(folder, "--job-dir")
    spec = slurm_jobs.JobSpec(refs[0].id, nodes, tasks_per_node, folder, partition, account, slurm_time)
    slurm_jobs.write_config(spec, config)  # as given: each task resolves it for the job's size
    click.echo(slurm_jobs.script(spec), nl=False)
