"""accelbench's pytest plugin (entry point ``pytest11``): fixtures for pytest-benchmark runs and
for plugin authors' contract tests, and the JSON hook that puts accelbench records into
``--benchmark-json`` files.

    def test_tf_step(accelbench_benchmark):
        record = accelbench_benchmark("tf_benchmarks:resnet50", global_batch=8, image_size=64)
        assert record.status == "ok"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from types import ModuleType

    from accelbench.execution.session import BackendSession
    from accelbench.records.results import Record

EXTRA_INFO_KEY = "accelbench_record"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("accelbench")
    group.addoption(
        "--accelbench-backend",
        action="append",
        default=[],
        help="backend id to benchmark (repeatable; default: every available one)",
    )
    group.addoption("--accelbench-batch-sizes", default="8", help="comma-separated global batch sizes")
    group.addoption("--accelbench-image-size", type=int, default=64, help="image side (default 64, for speed)")
    group.addoption("--accelbench-precision", default=None, help="precision (default: each backend's)")
    group.addoption("--accelbench-rounds", type=int, default=10, help="timed steps (pytest-benchmark rounds)")
    group.addoption("--accelbench-warmup", type=int, default=2, help="warm-up steps")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise ``accelbench_backend`` over the installed backends and ``accelbench_batch``
    over the batch sizes given on the command line."""
    options = metafunc.config.option
    if "accelbench_backend" in metafunc.fixturenames:
        ids = options.accelbench_backend or _available_backend_ids()
        metafunc.parametrize("accelbench_backend", ids)
    if "accelbench_batch" in metafunc.fixturenames:
        sizes = [int(b) for b in options.accelbench_batch_sizes.split(",") if b.strip()]
        metafunc.parametrize("accelbench_batch", sizes, ids=[f"batch{b}" for b in sizes])


def _available_backend_ids() -> list[str]:
    from accelbench.registry import PluginHost

    return [ref.id for ref in PluginHost().backends() if ref.unavailable_reason() is None]


@pytest.fixture
def accelbench_options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Run-config fields from the ``--accelbench-*`` command-line options."""
    options = request.config.option
    config = {"image_size": options.accelbench_image_size}
    if options.accelbench_precision:
        config["precision"] = options.accelbench_precision
    return {"config": config, "rounds": options.accelbench_rounds, "warmup": options.accelbench_warmup}


@pytest.fixture
def accelbench_session() -> Iterator[Callable[..., Any]]:
    """Start a persistent worker: ``accelbench_session("plugin:backend", **config)``.

    Skips the test when the backend cannot run here (the reason is the skip message).
    """
    from accelbench.execution.session import BackendSession, Unavailable
    from accelbench.planning.config import RunConfig
    from accelbench.registry import PluginHost

    sessions: list[BackendSession] = []

    def start(backend: str, **config: Any) -> BackendSession:
        [ref] = PluginHost().select(backends=[backend])
        try:
            session = BackendSession(ref, RunConfig.from_dict(config))
        except Unavailable as exc:
            pytest.skip(f"{backend}: {exc}")
        sessions.append(session)
        return session

    yield start
    for session in sessions:
        session.close()


@pytest.fixture
def accelbench_benchmark(benchmark: Any, accelbench_session: Callable[..., BackendSession]) -> Callable[..., Record | None]:
    """Time real training steps with pytest-benchmark and return the schema-valid record.

    Each round is one ``step()`` in the worker, ending with the device sync, so
    pytest-benchmark's statistics are seconds per step as the host sees them (they include the
    host<->worker pipe, well under a millisecond). The record's images/sec comes from the same
    steps timed inside the worker by the core timing loop, like ``accelbench run``; it goes into
    ``benchmark.extra_info``. Returns None when benchmarking is disabled.
    """

    def run(backend: str, rounds: int = 10, warmup_rounds: int = 2, **config: Any) -> Record | None:
        from accelbench.records import results as records

        session = accelbench_session(backend, **config)
        benchmark.group = f"{session.config.precision} global batch {session.config.global_batch}"
        benchmark.pedantic(session.step, rounds=rounds, warmup_rounds=warmup_rounds, iterations=1)
        if benchmark.disabled or not benchmark.stats:
            return None
        record = session.record(
            len(benchmark.stats.stats.data),
            warmup_rounds,
            timed_by="pytest-benchmark pedantic rounds; record times from the worker's timing loop",
        )
        records.check(record)
        benchmark.extra_info.update(
            {  # pytest-benchmark keeps extra_info as JSON: the record's JSON form
                "images_per_sec": record.images_per_sec(),
                "global_batch": record.batch.global_,
                "per_device_batch": record.batch.per_device,
                "precision": record.precision,
                "framework": record.framework.name,
                "device": f"{record.device.kind}x{record.device.count} {record.device.name}",
                EXTRA_INFO_KEY: record.to_json(),
            }
        )
        return record

    return run


@pytest.fixture
def accelbench_contract() -> ModuleType:
    """Contract checks a plugin author can run against any backend (see ``accelbench.authoring.contract``)."""
    from accelbench.authoring import contract

    return contract


def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list[Any], output_json: dict[str, Any]) -> None:
    """Add an ``accelbench`` block holding every accelbench record of the run, each validated."""
    from accelbench.records import results as records
    from accelbench.records import validation

    found = [
        b["extra_info"][EXTRA_INFO_KEY] for b in output_json.get("benchmarks", []) if EXTRA_INFO_KEY in b.get("extra_info", {})
    ]
    if not found:
        return
    for record in found:
        records.check(records.Record.from_json(record))
    output_json["accelbench"] = {"schema_version": validation.RESULT_SCHEMA_VERSION, "records": found}
