"""--allocator: the memory allocator preloaded into each worker, and read back from its memory map."""

import ctypes.util
import subprocess
import sys

import pytest

from accelbench import allocators
from conftest import load_records


def mapped_path(soname: str) -> str:
    """Where the dynamic loader finds ``soname``: loaded in a throwaway process, read off its map."""
    out = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({soname!r}); "
                          f"print(next(l.split()[-1] for l in open('/proc/self/maps') if {soname!r} in l))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def allocator_of_run(accelbench_cli, tmp_path, *args) -> str:
    out = tmp_path / "r.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--backend", "sleepy:fixed-time", "--global-batch", "4",
                            "--warmup-steps", "1", "--timed-steps", "3", *args, "-o", str(out), "--force")
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert record["status"] == "ok", record["reason"]
    return record["settings"]["allocator"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD and /proc are Linux's")
def test_the_record_names_the_allocator_each_worker_has_mapped(accelbench_cli, tmp_path):
    # the test backend declares no allocator of its own: auto is the system's
    assert allocator_of_run(accelbench_cli, tmp_path) == "system (the C library's malloc)"
    assert allocator_of_run(accelbench_cli, tmp_path, "--allocator", "system") == "system (the C library's malloc)"
    # glibc's own malloc-debugging library (glibc >= 2.34) stands in for any allocator given by
    # path: it is on every such machine and changes nothing unless MALLOC_CHECK_ is set
    debug = ctypes.util.find_library("c_malloc_debug")
    if debug:
        path = mapped_path(debug)
        assert allocator_of_run(accelbench_cli, tmp_path, "--allocator", path) == f"preloaded ({path})"
    for name, (library, _) in allocators.KNOWN.items():
        if ctypes.util.find_library(library):  # installed on this machine (apt install libjemalloc2)
            assert allocator_of_run(accelbench_cli, tmp_path, "--allocator", name).startswith(f"{name} (/")


@pytest.mark.parametrize("value, message", [
    ("hoard", "--allocator: 'hoard' is neither auto, system, jemalloc, tcmalloc nor the absolute path of a shared library"),
    ("/no/such/libmalloc.so", "--allocator: '/no/such/libmalloc.so' is neither"),
])
def test_an_allocator_that_cannot_be_had_is_refused_before_any_worker(accelbench_cli, tmp_path, value, message):
    out = tmp_path / "r.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--allocator", value, "-o", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not out.exists()


def test_a_known_allocator_is_read_off_the_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
                    "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n")
    assert allocators.loaded(str(maps)) == "jemalloc (/usr/lib/x86_64-linux-gnu/libjemalloc.so.2)"
    maps.write_text("7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert allocators.loaded(str(maps)) == "system (the C library's malloc)"


def test_auto_is_the_backends_measured_choice_only_where_it_is_installed(monkeypatch):
    monkeypatch.setitem(allocators.KNOWN, "absentmalloc", ("accelbench_absent_malloc", "libabsentmalloc1"))
    assert allocators.resolve("auto", None) == "system"
    assert allocators.resolve("auto", "absentmalloc") == "system"
    assert allocators.resolve("system", "absentmalloc") == "system"  # the user's choice stands
    assert "absentmalloc" in allocators.missing_preference("absentmalloc")
    assert "apt install libabsentmalloc1" in allocators.missing_preference("absentmalloc")
    assert allocators.missing_preference(None) is None
    for name, (library, _) in allocators.KNOWN.items():
        if ctypes.util.find_library(library):
            assert allocators.resolve("auto", name) == name and allocators.missing_preference(name) is None
