"""Bad input is one line and exit 2 before any worker starts, with nothing written; SIGTERM and a
killed host leave no process behind; a finished measurement is never lost to an option."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import alive, load_records, start_with_a_hang

SLEEPY = ("--plugin", "sleepy", "--timed-steps", "3", "--warmup-steps", "1")


@pytest.fixture
def files(tmp_path):
    """Files the bad inputs point at, made fresh for each case."""
    (tmp_path / "existing_file").write_text("a file, not a folder\n")
    (tmp_path / "important.txt").write_text("precious\n")
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "latin1.json").write_bytes(b'{"trials": 2, "seed": "\xe9"}')
    (tmp_path / "null.json").write_text("null")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    (tmp_path / "nan.json").write_text('{"timeout_s": NaN}')
    (tmp_path / "nan.toml").write_text("timeout_s = nan\n")
    (tmp_path / "bench.json").write_text(json.dumps({"benchmarks": [], "accelbench": ["not", "a", "block"]}))
    (tmp_path / "twice.json").write_text('{"trials": 2, "seed": 1, "trials": 3}')
    os.mkfifo(tmp_path / "fifo")  # a read would block forever
    return tmp_path


BAD_INPUTS = [
    (["run", *SLEEPY, "--epochs", "0"], "'--epochs': 0 is not in the range x>=1"),
    (["run", *SLEEPY, "--epochs", "-3"], "'--epochs': -3 is not in the range x>=1"),
    (["run", *SLEEPY, "--price-per-hour", "inf"], "'--price-per-hour': 'inf' is not a finite number"),
    (["run", *SLEEPY, "--price-per-hour", "nan"], "'--price-per-hour': 'nan' is not a finite number"),
    (["run", *SLEEPY, "--price-per-hour", "0"], "--price-per-hour must be positive"),
    (["run", *SLEEPY, "--timeout", "nan"], "'--timeout': 'nan' is not a finite number"),
    (["run", *SLEEPY, "--timeout", "inf"], "'--timeout': 'inf' is not a finite number"),
    (["run", *SLEEPY, "-o", "/proc/nope/x.json"], "-o: cannot write in /proc/nope"),
    (["run", *SLEEPY, "-o", "{tmp}/existing_file/x.json"], "existing_file is a file, so no folder can be made"),
    (["run", *SLEEPY, "-o", "{tmp}/a_folder"], "a_folder' is a directory"),
    (["run", *SLEEPY, "-o", "{tmp}/important.txt"], "exists and is not an accelbench results file"),
    (["run", *SLEEPY, "--config", "{tmp}/latin1.json"], "latin1.json: not UTF-8 text"),
    (["run", *SLEEPY, "--config", "{tmp}/null.json"], "must hold an object of run fields, not NoneType"),
    (["run", *SLEEPY, "--config", "{tmp}/list.json"], "must hold an object of run fields, not list"),
    (["run", *SLEEPY, "--config", "{tmp}/deep.json"], "nested too deeply"),
    (["run", *SLEEPY, "--config", "{tmp}/nan.json"], "NaN is not a number JSON allows"),
    (["run", *SLEEPY, "--config", "{tmp}/nan.toml"], "$.timeout_s is nan, not a finite number"),
    (["compare", "{tmp}/bench.json", "{tmp}/bench.json"], "its accelbench block is not"),
    (["compare", "{tmp}/latin1.json"], "not UTF-8 text"),
    (["report", "{tmp}/nan.json", "--out", "{tmp}/rep"], "NaN is not a number JSON allows"),
    (["train", "--target-top1", "nan"], "'--target-top1': 'nan' is not a finite number"),
    (["train", "--target-top1", "1.5", "-o", "{tmp}/t.json"], "--target-top1 must be in (0, 1], got 1.5"),
    # backend options are checked against each backend's typed declaration (accelbench.Option)
    (
        ["run", "--plugin", "tpu_official", "--option", "steps_per_loop=-1"],
        "--option steps_per_loop: must be at least 1, got -1 (tpu_official:resnet50)",
    ),
    (
        ["run", "--plugin", "tpu_official", "--option", "steps_per_loop=2.5"],
        "--option steps_per_loop: must be an integer, got 2.5",
    ),
    (["run", "--plugin", "mxnet_ngc", "--option", "kvstore=nccl"], "--option kvstore: must be one of device, local, got 'nccl'"),
    (
        ["run", "--plugin", "torch_ref", "--option", "compile=yes"],
        "--option compile: must be a boolean (true or false), got 'yes'",
    ),
    (["run", "--plugin", "tf_benchmarks", "--option", "jit=1"], "unknown option 'jit' for the selected backends"),
    # worker environments
    (["run", *SLEEPY, "--env", "six=<1 !!"], "--env: 'six=<1 !!' is not a requirement"),
    (["run", *SLEEPY, "--env", " , "], "--env: no requirement in ' , '"),
    (["run", *SLEEPY, "--python", "sleepy"], "--python must be PLUGIN=PATH, got 'sleepy'"),
    (["run", *SLEEPY, "--python", "sleepy={tmp}/important.txt"], "important.txt: not an executable file"),
    (["run", *SLEEPY, "--python", f"other={sys.executable}"], "--python other=...: no selected backend is from plugin 'other'"),
    # found by a hostile new user (issue 54): a traceback, hangs, and values accepted silently
    (["run", *SLEEPY, "--timeout", "1e308"], "'--timeout': '1e308' is not between 0 and 2592000 seconds"),
    (["run", *SLEEPY, "--config", "{tmp}/fifo"], "fifo: not a regular file"),
    (["run", *SLEEPY, "--config", "{tmp}/twice.json"], "the key 'trials' appears twice in one object"),
    (["run", *SLEEPY, "--batch-sizes", "8,,16"], "--batch-sizes has an empty item in '8,,16'"),
    (["train", "--decay-epochs", "30,,60"], "--decay-epochs has an empty item in '30,,60'"),
    (
        [
            "worker",
            "--plugin",
            "torch_ref",
            "--rank",
            "0",
            "--workers",
            "2",
            "--coordinator",
            "127.0.0.1:99999",
            "-o",
            "{tmp}/w.json",
        ],
        "--coordinator '127.0.0.1:99999': give HOST:PORT with a port in 1..65535",
    ),
    (
        [
            "worker",
            "--plugin",
            "torch_ref",
            "--rank",
            "0",
            "--workers",
            "2",
            "--coordinator",
            "127.0.0.1:29500",
            "--peers",
            "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
            "-o",
            "{tmp}/w.json",
        ],
        "--peers names 3 workers but --workers is 2",
    ),
    (
        [
            "worker",
            "--plugin",
            "torch_ref",
            "--rank",
            "2",
            "--local-workers",
            "3",
            "--workers",
            "4",
            "--coordinator",
            "127.0.0.1:29500",
            "-o",
            "{tmp}/w.json",
        ],
        "--rank 2 with --local-workers 3 runs ranks up to 4, beyond the job's 4 workers",
    ),
    (["env", "remove", "0123456789abcdef"], "env remove: no environment has the key '0123456789abcdef'"),
    # found by the hypothesis test of every command: refusals that named a file but not its flag, and tracebacks
    (["run", *SLEEPY, "--config", "0"], "--config 0: No such file or directory"),
    (["run", *SLEEPY, "--config", "{tmp}/bench.json"], "bench.json: 'accelbench', 'benchmarks' are not run fields"),
    (["run", *SLEEPY, "--price", "0"], "--price '0' is not in the catalogue"),
    (["run", *SLEEPY, "--prices", "0"], "--prices 0: No such file or directory"),
    (["rerun", "0"], "results file 0: No such file or directory"),
    (["train", "--data", " "], "--data ' ': not a converted dataset"),
    (["data", "", "{tmp}/out"], "SOURCE '' is neither 'digits' nor a folder"),
    (["data", "digits", "/proc/nope/out"], "OUT '/proc/nope/out': cannot make the folder there"),
    (["new-plugin", "mine", "--dir", "/proc/nope/mine"], "new-plugin --dir /proc/nope/mine: cannot make the folder there"),
    (["report", "--evidence", "x" * 3000, "--markdown"], "not a folder of results files"),
    (["compare", "x" * 3000], "File name too long"),
    (["run", *SLEEPY, "--time", "9" * 30], "--time must be at most 604800 (got 1e+30)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_nothing_written(accelbench_cli, files, args, message):
    before = {p: p.stat().st_mtime_ns for p in files.rglob("*")}
    result = accelbench_cli(*[a.format(tmp=files) for a in args], timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    after = {p: p.stat().st_mtime_ns for p in files.rglob("*")}
    assert after == before  # no file created or changed


def test_validate_refuses_a_fifo_without_blocking(accelbench_cli, files):
    result = accelbench_cli("validate", str(files / "fifo"), timeout=30)
    assert result.returncode == 1 and "fifo: not a regular file" in result.stdout, (result.stdout, result.stderr)


def test_an_unknown_name_in_the_plugin_allow_list_is_refused(accelbench_cli):
    result = accelbench_cli("plugins", plugins="sleepy,nonexistent")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "ACCELBENCH_PLUGINS: no installed plugin is named 'nonexistent'" in result.stderr


def test_report_out_in_an_unwritable_place(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    result = accelbench_cli("report", str(out), "--out", "/proc/nope/report")
    assert result.returncode == 2 and result.stderr.startswith("error: --out /proc/nope/report: cannot write there")


@pytest.mark.slow
def test_a_dollar_in_a_plugin_name_is_plain_text_in_the_report(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    document = json.loads(out.read_text())
    document["records"][0]["plugin"]["name"] = "price$plugin"
    out.write_text(json.dumps(document))
    result = accelbench_cli("report", str(out), "--out", str(tmp_path / "rep"))
    assert result.returncode == 0, result.stderr
    assert "price$plugin" in (tmp_path / "rep" / "index.html").read_text()


@pytest.mark.slow
def test_results_files_are_appended_to_or_replaced_with_force(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    for _ in range(2):
        assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    assert len(load_records(out)) == 2
    assert accelbench_cli("run", *SLEEPY, "-o", str(out), "--force").returncode == 0
    assert len(load_records(out)) == 1


def test_nan_is_never_written_and_validate_refuses_it(accelbench_cli, tmp_path):
    from accelbench.records import results as records

    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    good = json.loads(out.read_text())
    bad = dict(
        good, records=[dict(good["records"][0], throughput=dict(good["records"][0]["throughput"], images_per_sec=float("nan")))]
    )
    with pytest.raises(ValueError):
        records.write_results(tmp_path / "nan.json", [records.Record.from_json(r) for r in bad["records"]])
    assert not (tmp_path / "nan.json").exists()
    (tmp_path / "nan.json").write_text(json.dumps(bad))  # Python's json writes NaN when allowed
    (tmp_path / "text.json").write_text("not json")
    result = accelbench_cli("validate", str(tmp_path / "nan.json"), str(tmp_path / "text.json"), str(out))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'nan.json'}: not JSON (NaN is not a number JSON allows")
    assert lines[1].startswith(f"{tmp_path / 'text.json'}: not JSON")
    assert lines[2] == f"{out}: ok (1 record)"  # every file is checked


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_stops_the_workers_and_keeps_finished_records(testplugins_path, tmp_path, signum):
    host, out, workers = start_with_a_hang(testplugins_path, tmp_path)
    host.send_signal(signum)
    _, err = host.communicate(timeout=60)
    assert host.returncode == 128 + signum
    assert f"stopped by {signal.Signals(signum).name}: kept 1 finished record" in err
    [record] = load_records(out)
    assert record["backend"]["name"] == "fixed-time" and record["status"] == "ok"
    assert not any(alive(pid) for pid in workers)
    # no record points at the interrupted worker's log, so none is left behind
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_killed_host_takes_its_workers_with_it(testplugins_path, tmp_path):
    host, _, workers = start_with_a_hang(testplugins_path, tmp_path)
    host.kill()  # SIGKILL: no handler runs in the host; the kernel ends the workers
    host.wait(30)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)


def test_a_corrupt_image_is_refused_by_name_before_conversion(accelbench_cli, tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for label in ("a", "b"):
            folder = tmp_path / "src" / split / label
            folder.mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(folder / f"{i}.png")
    broken = tmp_path / "src" / "train" / "b" / "1.png"
    broken.write_text("this is text named like a picture")
    result = accelbench_cli("data", str(tmp_path / "src"), str(tmp_path / "out"))
    assert result.returncode == 2 and f"{broken}: not a decodable image" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_worker_growing_past_its_memory_limit_is_stopped_with_a_record(accelbench_cli, tmp_path):
    """Resident memory of the worker, watched by the host (train mode has a default limit)."""
    out = tmp_path / "r.json"
    started = time.monotonic()
    result = accelbench_cli(
        "run",
        "--backend",
        "misbehaving:oom",
        "--backend",
        "sleepy:fixed-time",
        "--memory-limit-mb",
        "600",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "3",
        "-o",
        str(out),
    )
    assert time.monotonic() - started < 60 and result.returncode == 1
    oom, sleepy = load_records(out)
    assert oom["status"] == "failed" and oom["reason"].startswith("out of memory: the worker held ")
    held = int(oom["reason"].split("held ")[1].split(" MB")[0])
    assert 600 < held < 600 + 2 * 256 + 200  # stopped within a chunk or two of the limit
    assert sleepy["status"] == "ok"


@pytest.mark.slow
def test_concurrent_runs_on_one_results_file_keep_every_record(accelbench_cli, tmp_path):
    """Four runs writing one file at once (two teammates, an array job): each rewrites the file
    after every trial, so without the lock and the merge the last writer's records alone were left."""
    import concurrent.futures

    shared = tmp_path / "shared.json"
    args = (
        "run",
        "--backend",
        "sleepy:fixed-time",
        "--trials",
        "3",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "3",
        "--option",
        "step_ms=5",
        "-o",
        str(shared),
    )
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: accelbench_cli(*args), range(4)))
    assert [d.returncode for d in done] == [0] * 4, [d.stderr[-500:] for d in done]
    document = json.loads(shared.read_text())
    assert len(document["records"]) == 4 and all(r["status"] == "ok" for r in document["records"])
    assert accelbench_cli("validate", str(shared)).returncode == 0
    # the lock was held on the folder: nothing but the results file is left in it (#66)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]


def test_a_writer_that_cannot_get_the_lock_keeps_its_records_beside_the_file(tmp_path, monkeypatch, capsys):
    import fcntl

    from accelbench.records import results as records

    shared = tmp_path / "shared.json"
    [record] = json.loads((Path(__file__).parent / "fixtures" / "records-1.9.0.json").read_text())["records"][:1]
    record = records.Record.from_json({**record, "schema_version": records.validation.RESULT_SCHEMA_VERSION})
    monkeypatch.setattr(records.ResultsWriter, "LOCK_TIMEOUT_S", 0.2)
    held = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)  # another writer, stuck
        written = records.ResultsWriter(shared).write([record])
    finally:
        os.close(held)
    assert written != shared and not shared.exists()
    assert json.loads(written.read_text())["records"] == [record.to_json()]
    assert f"this run's records are in {written}" in capsys.readouterr().err


def test_two_writers_merge_and_each_replaces_only_its_own_records(tmp_path):
    from accelbench.records import results as records

    shared = tmp_path / "shared.json"
    base = json.loads((Path(__file__).parent / "fixtures" / "records-1.9.0.json").read_text())["records"]
    a1, a2, b1 = (
        records.Record.from_json({**r, "schema_version": records.validation.RESULT_SCHEMA_VERSION, "warnings": [tag]})
        for r, tag in zip([base[0], base[0], base[1]], ["a1", "a2", "b1"])
    )
    first, second = records.ResultsWriter(shared), records.ResultsWriter(shared)
    first.write([a1])
    second.write([b1])
    first.write([a2])  # a1 grew into a2: replaced, b1 kept
    assert json.loads(shared.read_text())["records"] == [b1.to_json(), a2.to_json()]
    records.ResultsWriter(shared, force=True).write([a1])
    assert json.loads(shared.read_text())["records"] == [a1.to_json()]


@pytest.mark.slow
def test_a_results_file_read_into_records_and_written_again_is_byte_identical(accelbench_cli, tmp_path):
    """The typed records are the file: a lockstep run's results (trials with blocks and positions,
    a schedule, an environment, memory, start-up, a cost) read with ``Record.from_json`` and
    written again give the same bytes."""
    from accelbench.records import results as records

    out = tmp_path / "r.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--plugin",
        "twin",
        "--trials",
        "2",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "4",
        "--option",
        "step_ms=5",
        "--price-per-hour",
        "1.5",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    document = records.read_document(out)
    assert [r.schedule.kind for r in document.records if r.schedule] == ["lockstep", "lockstep"]
    assert all(r.cost and r.cost.price and r.trials[0].blocks for r in document.records)
    again = tmp_path / "again.json"
    records.write_document(again, document.to_json())
    assert again.read_bytes() == out.read_bytes()
