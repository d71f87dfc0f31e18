"""--allocator: the memory allocator preloaded into each worker, and read back from its memory map."""

import ctypes.util
import subprocess
import sys

import pytest
from conftest import load_records

from accelbench.execution import allocators


def mapped_path(soname: str) -> str:
    """Where the dynamic loader finds ``soname``: loaded in a throwaway process, read off its map."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import ctypes; ctypes.CDLL({soname!r}); "
            f"print(next(l.split()[-1] for l in open('/proc/self/maps') if {soname!r} in l))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def allocator_of_run(accelbench_cli, tmp_path, *args) -> str:
    out = tmp_path / "r.json"
    result = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--backend",
        "sleepy:fixed-time",
        "--global-batch",
        "4",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "3",
        *args,
        "-o",
        str(out),
        "--force",
    )
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert record["status"] == "ok", record["reason"]
    return record["settings"]["allocator"]


@pytest.mark.slow
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


@pytest.mark.parametrize(
    "value, message",
    [
        ("hoard", "--allocator: 'hoard' is neither auto, system, jemalloc, tcmalloc nor the absolute path of a shared library"),
        ("/no/such/libmalloc.so", "--allocator: '/no/such/libmalloc.so' is neither"),
    ],
)
def test_an_allocator_that_cannot_be_had_is_refused_before_any_worker(accelbench_cli, tmp_path, value, message):
    out = tmp_path / "r.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--allocator", value, "-o", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert not out.exists()


def test_a_known_allocator_is_read_off_the_memory_map(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        "7f04-7f05 rw-p 00000000 00:00 0 [heap]\n"
    )
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
    assert allocators.missing_preference("absentmalloc", "gpu") is None  # measured on a CPU: no advice for a GPU run
    for name, (library, _) in allocators.KNOWN.items():
        if ctypes.util.find_library(library):
            assert allocators.resolve("auto", name) == name and allocators.missing_preference(name) is None


# --huge-pages: the allocator asked to map its memory in transparent huge pages


@pytest.mark.parametrize(
    "allocator, mode, glibc, problem",
    [
        ("system", "madvise", "glibc 2.36", None),
        ("jemalloc", "madvise", "glibc 2.36", None),
        ("system", "always", "glibc 2.35", None),
        ("system", "never", "glibc 2.36", "this kernel gives no transparent huge pages"),
        ("system", None, "glibc 2.36", "transparent_hugepage/enabled: absent"),
        ("system", "madvise", "glibc 2.31", "the C library here (glibc 2.31) has no glibc.malloc.hugetlb tunable"),
        ("system", "madvise", "", "the C library here (not glibc) has no glibc.malloc.hugetlb"),
        ("tcmalloc", "madvise", "glibc 2.36", "the allocator 'tcmalloc' has no setting accelbench knows"),
        ("/opt/libmymalloc.so", "madvise", "glibc 2.36", "the allocator '/opt/libmymalloc.so' has no setting"),
    ],
)
def test_huge_pages_are_refused_where_kernel_or_allocator_cannot_give_them(allocator, mode, glibc, problem):
    found = allocators.huge_pages_problem_with(allocator, mode, glibc)
    if problem is None:
        assert found is None
    else:
        assert found.startswith("--huge-pages on: ") and problem in found, found


def test_the_kernels_thp_mode_is_the_bracketed_word(tmp_path):
    enabled = tmp_path / "enabled"
    enabled.write_text("always [madvise] never\n")
    assert allocators.thp_mode(str(enabled)) == "madvise"
    enabled.write_text("[always] madvise never\n")
    assert allocators.thp_mode(str(enabled)) == "always"
    assert allocators.thp_mode(str(tmp_path / "absent")) is None


def test_auto_huge_pages_follow_the_backends_measurement_where_they_can_be_had(monkeypatch):
    monkeypatch.setattr(allocators, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(allocators, "_glibc", lambda: "glibc 2.36")
    assert allocators.resolve_huge_pages("auto", True, "system") == "on"
    assert allocators.resolve_huge_pages("auto", True, "tcmalloc") == "off"  # no setting for it: off, silently
    assert allocators.resolve_huge_pages("auto", False, "system") == "off"
    assert allocators.resolve_huge_pages("off", True, "system") == "off"  # the user's choice stands
    assert allocators.resolve_huge_pages("on", False, "system") == "on"
    monkeypatch.setattr(allocators, "thp_mode", lambda: "never")
    assert allocators.resolve_huge_pages("auto", True, "system") == "off"


def test_the_tunable_joins_the_users_own(monkeypatch):
    monkeypatch.setattr(allocators, "thp_mode", lambda: "madvise")
    monkeypatch.setattr(allocators, "_glibc", lambda: "glibc 2.36")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert allocators.worker_environment("system", "on") == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert allocators.worker_environment("system", "off") == {}
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert allocators.worker_environment("system", "on") == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    if allocators.installed("jemalloc"):
        monkeypatch.setenv("MALLOC_CONF", "narenas:2")
        env = allocators.worker_environment("jemalloc", "on")
        assert env["MALLOC_CONF"] == "narenas:2,thp:always" and "libjemalloc" in env["LD_PRELOAD"]


def test_the_record_reads_huge_pages_from_the_workers_environment(monkeypatch):
    monkeypatch.setattr(allocators, "thp_mode", lambda: "madvise")
    on = allocators.huge_pages_setting("system", {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"})
    assert on == "on (GLIBC_TUNABLES has glibc.malloc.hugetlb=1; the kernel's THP mode: madvise)"
    assert allocators.huge_pages_setting("system", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}).startswith("off (")
    assert allocators.huge_pages_setting("tcmalloc", {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}).startswith("off (")
    assert allocators.huge_pages_setting("jemalloc", {"MALLOC_CONF": "narenas:2,thp:always"}).startswith("on (")
    monkeypatch.setattr(allocators, "thp_mode", lambda: "always")
    assert "THP mode: always, which backs any large enough mapping" in allocators.huge_pages_setting("system", {})


def test_huge_page_bytes_are_read_off_smaps_rollup(tmp_path):
    smaps = tmp_path / "smaps_rollup"
    smaps.write_text("Rss:              981812 kB\nAnonHugePages:    425984 kB\n")
    assert allocators.huge_page_bytes(str(smaps)) == 425984 * 1024
    smaps.write_text("Rss:              981812 kB\n")
    assert allocators.huge_page_bytes(str(smaps)) is None
    assert allocators.huge_page_bytes(str(tmp_path / "absent")) is None


def thp_fault_fallbacks() -> int:
    """The kernel's count of faults in a huge-page region it had to back with small pages (machine-wide)."""
    with open("/proc/vmstat") as vmstat:
        counters = dict(line.split() for line in vmstat)
    return int(counters.get("thp_fault_fallback", 0))


def held_memory_run(accelbench_cli, tmp_path, huge_pages: str) -> dict:
    out = tmp_path / f"{huge_pages}.json"
    result = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--backend",
        "sleepy:fixed-time",
        "--global-batch",
        "4",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "2",
        "--option",
        "hold_mb=64",
        "--huge-pages",
        huge_pages,
        "-o",
        str(out),
        "--force",
    )
    assert result.returncode == 0, result.stderr
    [record] = load_records(out)
    assert record["status"] == "ok", record["reason"]
    return record


@pytest.mark.slow
@pytest.mark.skipif(
    allocators.thp_mode() != "madvise" or allocators.huge_pages_problem("system") is not None,
    reason="needs a kernel whose THP mode is madvise (always backs every mapping) and glibc >= 2.35",
)
def test_huge_pages_on_backs_the_workers_memory_and_off_does_not(accelbench_cli, tmp_path):
    fallbacks_before = thp_fault_fallbacks()
    on = held_memory_run(accelbench_cli, tmp_path, "on")
    fallbacks = thp_fault_fallbacks() - fallbacks_before
    off = held_memory_run(accelbench_cli, tmp_path, "off")
    assert on["config"]["huge_pages"] == "on" and on["settings"]["huge_pages"].startswith(
        "on (GLIBC_TUNABLES has glibc.malloc.hugetlb=1;"
    )
    assert off["config"]["huge_pages"] == "off" and off["settings"]["huge_pages"].startswith("off (")
    # the 64 MiB held: all of it but its unaligned ends asked for in 2 MiB pages with them on, none without.
    # THP is best effort: where the kernel finds no free 2 MiB run it falls back to small pages and counts
    # it (CI once backed 56 of the 64 MiB), so the pages it could not give are counted with those it gave.
    huge = on["trials"][0]["process"]["anon_huge_pages_bytes"]
    assert huge > 0 and huge + fallbacks * (2 << 20) >= 60 << 20, (huge, fallbacks)
    assert off["trials"][0]["process"]["anon_huge_pages_bytes"] < 4 << 20


def test_huge_pages_that_cannot_be_had_are_refused_before_any_worker(accelbench_cli, tmp_path):
    debug = ctypes.util.find_library("c_malloc_debug")
    if not debug:
        pytest.skip("needs glibc's libc_malloc_debug (glibc >= 2.34) as an allocator given by path")
    path = mapped_path(debug)
    out = tmp_path / "r.json"
    result = accelbench_cli("run", "--plugin", "sleepy", "--allocator", path, "--huge-pages", "on", "-o", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"--huge-pages on: the allocator {path!r} has no setting" in result.stderr, result.stderr
    assert not out.exists()
