"""Runs of several workers as one record: a local multi-worker trial (every rank on this machine)
and one rank of a multi-host job (``accelbench worker``), each with the record's ``distributed``
block. The processes themselves are driven by ``accelbench.execution.multiworker``; the engine that joins
them is the plugin's (``accelbench.launch.Engine``).
"""

from __future__ import annotations

import sys
import tempfile
from typing import Callable

from accelbench import launch
from accelbench.environments import machine as environment
from accelbench.environments import python_envs as envs
from accelbench.execution import multiworker, netns
from accelbench.execution.processes import WorkerFailure
from accelbench.launch import Engine, LaunchPlan
from accelbench.planning.config import RunConfig
from accelbench.records.blocks import Distributed, Launcher
from accelbench.records.results import Record, RunContext, TrialOutcome, build
from accelbench.registry import BackendRef


def local_trial(
    ctx: RunContext, progress: Callable[[str, int, int | None], None] | None, python: str | None = None
) -> TrialOutcome:
    """One trial of a multi-worker plan, every rank on this machine inside a loopback-only network
    namespace where the kernel gives one; keeps the workers' block of the latest trial on ``ctx``."""
    engine, cfg = _engine(ctx.ref), ctx.config
    namespace, network = netns.start()
    try:
        launcher = namespace.launcher() if namespace else []
        with tempfile.TemporaryDirectory(prefix="accelbench-job-") as scratch:
            outcomes = multiworker.run_trial(
                ctx.ref, cfg, launch.plan_local(engine, cfg.workers, scratch), progress, launcher=launcher, python=python
            )
    finally:
        if namespace:
            namespace.close()
    ctx.distributed = _distributed_block(engine.name, cfg, outcomes, 0, None, network)
    return multiworker.merge(outcomes)


def _engine(ref: BackendRef) -> Engine:
    """The backend's multi-worker engine (planning refuses ``--workers`` for a backend without one)."""
    if ref.backend.engine is None:
        raise WorkerFailure("failed", f"{ref.id} has no multi-worker engine")
    return ref.backend.engine


#: a multi-host job's engine must be reachable from the other hosts: the network must be trusted
MULTI_HOST_NETWORK = "the host's network (a multi-host job: its engine's ports are open to the other hosts)"


def _distributed_block(
    engine: str,
    cfg: RunConfig,
    outcomes: list[TrialOutcome],
    first_rank: int,
    baseline: float | None,
    network: str,
    first_local_rank: int = 0,
) -> Distributed:
    """The record's ``distributed`` block; ``records.build`` adds the scaling efficiency."""
    per_worker_batch = cfg.resolved_per_device_batch * cfg.resolved_device_count
    return Distributed(
        engine,
        cfg.workers,
        per_worker_batch,
        multiworker.per_worker(outcomes, per_worker_batch, first_rank, first_local_rank),
        baseline,
        None,
        network,
    )


def run_rank(
    ref: BackendRef, config: RunConfig, launch_plan: LaunchPlan, rank: int, local_rank: int = 0, launcher: Launcher | None = None
) -> Record:
    """One rank of a multi-host job (``accelbench worker``): its record, merged later with the
    other ranks' by ``accelbench merge``. Its throughput is the job's as this rank timed it."""
    [setup] = envs.setups_for(ref)
    try:
        python, described = envs.interpreter(setup, True, lambda text: print(text, file=sys.stderr))
    except envs.EnvironmentNotMade as exc:
        return build(
            RunContext(
                ref,
                config,
                environment.collect(ref.backend.describe().requires),
                [TrialOutcome("unavailable", f"no worker environment: {exc}")],
            )
        )
    outcomes = multiworker.run_trial(ref, config, launch_plan, python=python)
    ctx = RunContext(
        ref, config, environment.collect(ref.backend.describe().requires), [multiworker.merge(outcomes)], worker=described
    )
    ctx.distributed = _distributed_block(_engine(ref).name, config, outcomes, rank, None, MULTI_HOST_NETWORK, local_rank)
    ctx.distributed.launcher = launcher
    return build(ctx)
