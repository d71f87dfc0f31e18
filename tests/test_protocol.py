"""The worker protocol: typed requests answered by a real worker process, and a worker that speaks
another protocol (an environment made by another accelbench) refused in one line."""

import dataclasses
import inspect
import os
import stat
import sys
import textwrap

import pytest

from accelbench.backend import Prepared
from accelbench.execution import protocol, runner
from accelbench.execution.processes import Worker, WorkerFailure
from accelbench.execution.protocol import Check, Prepare, ReadDeviceMemory, Step, Teardown
from accelbench.execution.timing import Timing
from accelbench.execution.worker_main import Session
from accelbench.planning.config import RunConfig
from accelbench.registry import PluginHost


def sleepy_worker(testplugins_path, monkeypatch, python=None):
    monkeypatch.syspath_prepend(str(testplugins_path))
    [ref] = PluginHost().select(backends=["sleepy:fixed-time"])
    [item] = runner.plan([ref], RunConfig(scaling_baseline=False, options={"step_ms": 1}))
    return Worker(ref, item.config, timeout_s=60, python=python)


def test_requests_are_answered_with_the_types_they_name(testplugins_path, monkeypatch):
    worker = sleepy_worker(testplugins_path, monkeypatch)
    try:
        assert worker.call(Check()) is None
        assert isinstance(worker.call(Prepare()), Prepared)
        timing = worker.call(Step(calls=3))
        assert isinstance(timing, Timing) and timing.timed_calls == 3
        assert worker.installed is not None and worker.installed.python  # the worker's Hello, read first
        worker.call(ReadDeviceMemory())
        worker.call(Teardown())
    finally:
        worker.close()


def test_a_failing_request_is_a_worker_failure_naming_its_phase(testplugins_path, monkeypatch):
    worker = sleepy_worker(testplugins_path, monkeypatch)
    try:
        with pytest.raises(WorkerFailure, match="NotImplementedError: .*writes no dataset format"):
            worker.call(protocol.WriteDataset([("a", 0)], "x"))  # sleepy has no dataset format
        assert worker.phase == "write_dataset"
    finally:
        worker.close()


def test_a_worker_of_another_protocol_is_refused_in_one_line(testplugins_path, monkeypatch, tmp_path):
    """A worker environment made by an accelbench of the first protocol: its first message was the
    tuple ``("installed", ...)``. The host says so, in one line, and sends it no request."""
    old = tmp_path / "old_worker.py"
    old.write_text(
        textwrap.dedent(
            """
            import sys
            from multiprocessing.connection import Connection
            conn = Connection(int(sys.argv[-1]))
            paths, _ = conn.recv()
            sys.path[:0] = paths  # the host's extra paths: the test plugins
            conn.recv(), conn.recv()  # (backend, config), framework modules
            conn.send(("installed", None))
            print("asked:", conn.recv(), flush=True)
            """
        )
    )
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {old} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    worker = sleepy_worker(testplugins_path, monkeypatch, python=str(python))
    try:
        with pytest.raises(WorkerFailure) as refused:
            worker.call(Check())
        message = refused.value.reason
        assert "\n" not in message and f"the worker in {python} speaks worker protocol 1" in message
        assert f"this accelbench {protocol.PROTOCOL_VERSION}" in message and "accelbench env remove" in message
        assert worker.process.poll() is not None  # killed: it is asked nothing
        worker.name_log()
        assert "asked:" not in open(worker.log_path).read()
    finally:
        worker.close()
        os.unlink(worker.log_path)


def test_every_request_is_answered_by_a_method_of_the_workers_session():
    """Each request class names the session method that answers it, with the same parameters the
    request carries; the session implements every method of the protocol's ``WorkerSide``."""
    requests = [
        kind
        for kind in vars(protocol).values()
        if inspect.isclass(kind) and issubclass(kind, protocol.Request) and kind is not protocol.Request
    ]
    assert len(requests) == 14
    sides = {name for name, _ in inspect.getmembers(protocol.WorkerSide, inspect.isfunction) if not name.startswith("_")}
    assert sides <= {name for name, _ in inspect.getmembers(Session, inspect.isfunction)}
    for kind in requests:
        fields = [f.name for f in dataclasses.fields(kind)]
        answered_by = kind.phase
        assert answered_by in sides, kind
        assert list(inspect.signature(getattr(protocol.WorkerSide, answered_by)).parameters)[1:] == fields, kind
