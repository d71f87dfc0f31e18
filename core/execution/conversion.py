"""Dataset conversion (``accelbench data``): a source written in every installed framework's format
by that framework's own writer, in a worker of a backend that trains from it, and read back to
verify it (``accelbench.environments.datasets`` holds the sources and manifests).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

from accelbench.environments import datasets
from accelbench.environments import python_envs as envs
from accelbench.execution.processes import Worker, WorkerFailure
from accelbench.execution.protocol import AnswerT, ReadDataset, Request, WriteDataset
from accelbench.planning.config import RunConfig
from accelbench.registry import BackendRef

#: converting a full ImageNet copy takes hours; a hang is the user's to stop here
DATASET_TIMEOUT_S = 7 * 24 * 3600.0


class DatasetWriter:
    """Writes one split in one format, and reads it back, in a worker of the backend owning the
    format (the framework's own writer and reader); one worker serves every split."""

    def __init__(self, ref: BackendRef):
        self.ref = ref
        self.worker: Worker | None = None

    def __call__(self, examples: list[Any], stem: str) -> tuple[list[str], list[tuple[str, int]]]:
        files = self._call(WriteDataset([(e.path, e.label) for e in examples], stem))
        return files, self.read(files)

    def read(self, files: list[str]) -> list[tuple[str, int]]:
        """(sha256, label) of every record of these files, read by the framework."""
        return [(path, label) for path, label in self._call(ReadDataset(files))]

    def _call(self, request: Request[AnswerT]) -> AnswerT:
        if self.worker is None:
            [setup] = envs.setups_for(self.ref)
            try:
                python, _ = envs.interpreter(setup, True, lambda text: print(text, file=sys.stderr))
            except envs.EnvironmentNotMade as exc:
                raise RuntimeError(f"{self.ref.id}: no worker environment: {exc}") from None
            self.worker = Worker(
                self.ref, RunConfig(device="cpu", device_count=1), DATASET_TIMEOUT_S, label="data", python=python
            )
        worker = self.worker
        try:
            return worker.call(request)
        except WorkerFailure as failure:
            raise RuntimeError(f"{self.ref.id}: {request.phase} failed: {worker.keep_log(failure).reason}") from None

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


@contextlib.contextmanager
def dataset_writers(refs: list[BackendRef]) -> Iterator[dict[str, DatasetWriter]]:
    """One writer per dataset format, from the first available backend that trains from it;
    their workers are closed on leaving."""
    writers: dict[str, DatasetWriter] = {}
    # a backend the host's Python runs first: no environment is made just to write a format
    for ref in sorted(refs, key=lambda r: not envs.host_satisfies(r.backend.describe().environment)):
        fmt = ref.backend.describe().data_format
        if fmt and fmt not in writers and ref.unavailable_reason() is None:
            writers[fmt] = DatasetWriter(ref)
    try:
        yield writers
    finally:
        for writer in writers.values():
            writer.close()


def convert_dataset(
    source: str, out: Path, refs: list[BackendRef], preset: str | None = None, seed: int = 0
) -> datasets.DatasetManifest:
    """``accelbench data``: the source in every installed framework's format, verified."""
    with dataset_writers(refs) as writers:
        return datasets.convert(source, out, writers, preset, seed)


def default_dataset(refs: list[BackendRef]) -> Path:
    """The embedded digits, converted once (for every installed format) into the user's cache."""
    with dataset_writers(refs) as writers:
        return datasets.default_digits(datasets.cache_folder(), writers)
