"""Bad input is one line and exit 2 before any worker starts, with nothing written; SIGTERM and a
killed host leave no process behind; a finished measurement is never lost to an option."""

import json
import signal
import sys
import time

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
    (["run", "--plugin", "tpu_official", "--option", "steps_per_loop=-1"],
     "--option steps_per_loop: must be at least 1, got -1 (tpu_official:resnet50)"),
    (["run", "--plugin", "tpu_official", "--option", "steps_per_loop=2.5"], "--option steps_per_loop: must be an integer, got 2.5"),
    (["run", "--plugin", "mxnet_ngc", "--option", "kvstore=nccl"], "--option kvstore: must be one of device, local, got 'nccl'"),
    (["run", "--plugin", "torch_ref", "--option", "compile=yes"], "--option compile: must be a boolean (true or false), got 'yes'"),
    (["run", "--plugin", "tf_benchmarks", "--option", "jit=1"], "unknown option 'jit' for the selected backends"),
    # worker environments
    (["run", *SLEEPY, "--env", "six=<1 !!"], "--env: 'six=<1 !!' is not a requirement"),
    (["run", *SLEEPY, "--env", " , "], "--env: no requirement in ' , '"),
    (["run", *SLEEPY, "--python", "sleepy"], "--python must be PLUGIN=PATH, got 'sleepy'"),
    (["run", *SLEEPY, "--python", "sleepy={tmp}/important.txt"], "important.txt: not an executable file"),
    (["run", *SLEEPY, "--python", f"other={sys.executable}"], "--python other=...: no selected backend is from plugin 'other'"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_nothing_written(accelbench_cli, files, args, message):
    before = {p: p.stat().st_mtime_ns for p in files.rglob("*")}
    result = accelbench_cli(*[a.format(tmp=files) for a in args], timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    after = {p: p.stat().st_mtime_ns for p in files.rglob("*")}
    assert after == before  # no file created or changed


def test_report_out_in_an_unwritable_place(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    result = accelbench_cli("report", str(out), "--out", "/proc/nope/report")
    assert result.returncode == 2 and result.stderr.startswith("error: --out /proc/nope/report: cannot write there")


def test_a_dollar_in_a_plugin_name_is_plain_text_in_the_report(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    document = json.loads(out.read_text())
    document["records"][0]["plugin"]["name"] = "price$plugin"
    out.write_text(json.dumps(document))
    result = accelbench_cli("report", str(out), "--out", str(tmp_path / "rep"))
    assert result.returncode == 0, result.stderr
    assert "price$plugin" in (tmp_path / "rep" / "index.html").read_text()


def test_results_files_are_appended_to_or_replaced_with_force(accelbench_cli, tmp_path):
    out = tmp_path / "r.json"
    for _ in range(2):
        assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    assert len(load_records(out)) == 2
    assert accelbench_cli("run", *SLEEPY, "-o", str(out), "--force").returncode == 0
    assert len(load_records(out)) == 1


def test_nan_is_never_written_and_validate_refuses_it(accelbench_cli, tmp_path):
    from accelbench import records

    out = tmp_path / "r.json"
    assert accelbench_cli("run", *SLEEPY, "-o", str(out)).returncode == 0
    good = json.loads(out.read_text())
    bad = dict(good, records=[dict(good["records"][0], throughput=dict(good["records"][0]["throughput"],
                                                                       images_per_sec=float("nan")))])
    with pytest.raises(ValueError):
        records.write_results(tmp_path / "nan.json", bad["records"])
    assert not (tmp_path / "nan.json").exists()
    (tmp_path / "nan.json").write_text(json.dumps(bad))  # Python's json writes NaN when allowed
    (tmp_path / "text.json").write_text("not json")
    result = accelbench_cli("validate", str(tmp_path / "nan.json"), str(tmp_path / "text.json"), str(out))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'nan.json'}: not JSON (NaN is not a number JSON allows")
    assert lines[1].startswith(f"{tmp_path / 'text.json'}: not JSON")
    assert lines[2] == f"{out}: ok (1 record)"  # every file is checked


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


def test_a_worker_growing_past_its_memory_limit_is_stopped_with_a_record(accelbench_cli, tmp_path):
    """Resident memory of the worker, watched by the host (train mode has a default limit)."""
    out = tmp_path / "r.json"
    started = time.monotonic()
    result = accelbench_cli("run", "--backend", "misbehaving:oom", "--backend", "sleepy:fixed-time",
                            "--memory-limit-mb", "600", "--warmup-steps", "1", "--timed-steps", "3", "-o", str(out))
    assert time.monotonic() - started < 60 and result.returncode == 1
    oom, sleepy = load_records(out)
    assert oom["status"] == "failed" and oom["reason"].startswith("out of memory: the worker held ")
    held = int(oom["reason"].split("held ")[1].split(" MB")[0])
    assert 600 < held < 600 + 2 * 256 + 200  # stopped within a chunk or two of the limit
    assert sleepy["status"] == "ok"
