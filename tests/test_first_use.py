"""What is made on first use in the user's cache is made once, however many processes need it at
once (#66): the digits dataset, the measured peaks, and a results file's writers, two and four
processes at a time on an empty cache. (Worker environments: ``test_core_units``' lock test.)"""

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from accelbench.analysis import peaks
from accelbench.environments import datasets

#: forked processes: the functions below need no pickling, and the start is quick
FORK = multiprocessing.get_context("fork")


def fake_format(examples, stem):
    """A dataset format that is the images themselves, read back as they are (what the
    conversion's check compares), standing in for a framework's."""
    return [e.path for e in examples], [(datasets.file_digest(e.path), e.label) for e in examples]


def make_digits(cache: str, results) -> None:
    try:
        folder = datasets.default_digits(Path(cache), {"fake": fake_format})
        results.put(("ok", str(folder)))
    except BaseException as exc:  # noqa: BLE001 - the parent judges every process's end
        results.put(("failed", f"{type(exc).__name__}: {exc}"))


def keep_peak(cache: str, index: int, results) -> None:
    os.environ["XDG_CACHE_HOME"] = cache
    try:
        peaks.save_measured([peaks.Measured("m", "cpu", "cpu", f"framework{index}", "1.0", "fp32", 64, 1, 1e9 + index, "now")])
        results.put(("ok", index))
    except BaseException as exc:  # noqa: BLE001
        results.put(("failed", f"{type(exc).__name__}: {exc}"))


def at_once(target, args_of, count: int) -> list[tuple[str, object]]:
    results = FORK.Queue()
    processes = [FORK.Process(target=target, args=(*args_of(i), results)) for i in range(count)]
    for process in processes:
        process.start()
    found = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
def test_processes_that_need_the_digits_at_once_make_them_once(tmp_path, count):
    cache = tmp_path / "datasets"
    found = at_once(make_digits, lambda i: (str(cache),), count)
    assert [status for status, _ in found] == ["ok"] * count, found
    assert {folder for _, folder in found} == {str(cache / "digits")}
    manifest = datasets.load(cache / "digits")  # valid, and every image it lists decodes
    _, splits = datasets.index_folder(cache / "digits" / "images")
    for examples in splits.values():
        datasets.check_decodable(examples)
    assert manifest.count("train") == len(splits["train"])
    assert not [p for p in cache.iterdir() if p.name != "digits"]  # nothing half-made left beside it


@pytest.mark.parametrize("count", [2, 4])
def test_processes_that_keep_peaks_at_once_each_keep_theirs(tmp_path, count):
    found = at_once(keep_peak, lambda i: (str(tmp_path), i), count)
    assert [status for status, _ in found] == ["ok"] * count, found
    kept = json.loads((tmp_path / "accelbench" / "peaks.json").read_text())["measurements"]
    assert sorted(m["framework"] for m in kept) == [f"framework{i}" for i in range(count)]
    assert [p.name for p in (tmp_path / "accelbench").iterdir()] == ["peaks.json"]  # no temporary file left
