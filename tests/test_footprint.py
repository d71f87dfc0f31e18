"""What a run costs besides time (#56): peak memory, energy and start-up in every ok record.

The test backend (``sleepy``) holds a known amount of memory, reports a known device peak, sleeps
a known time in prepare, and can advance a fake RAPL counter (a folder the test writes, pointed
to by ``ACCELBENCH_POWERCAP_ROOT``) by a known amount per step.
"""

import pytest
from conftest import load_records

from accelbench.backend import DeviceMemory
from accelbench.execution import energy
from accelbench.execution.worker_main import _device_memory
from accelbench.records import footprint

MIB = 2**20


def fake_powercap(root, zones):
    """A powercap folder: ``zones`` maps a zone's folder name to (name, energy_uj, range_uj)."""
    for folder, (name, value, limit) in zones.items():
        zone = root / folder
        zone.mkdir(parents=True)
        (zone / "name").write_text(f"{name}\n")
        (zone / "energy_uj").write_text(f"{value}\n")
        (zone / "max_energy_range_uj").write_text(f"{limit}\n")
    return root


def run_sleepy(accelbench_cli, tmp_path, *options, trials="2", schedule=None, extra=()):
    out = tmp_path / "out.json"
    args = [
        "run",
        "--backend",
        "sleepy:fixed-time",
        "--trials",
        trials,
        "--warmup-steps",
        "3",
        "--timed-steps",
        "10",
        "--option",
        "step_ms=5",
        *[a for o in options for a in ("--option", o)],
        *extra,
        "-o",
        str(out),
    ]
    if schedule:
        args += ["--schedule", schedule]
    done = accelbench_cli(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    return load_records(out), done


@pytest.mark.slow
def test_the_record_holds_the_memory_the_worker_held_and_the_device_peak_the_framework_reported(accelbench_cli, tmp_path):
    [record], _ = run_sleepy(accelbench_cli, tmp_path, "hold_mb=300", "device_bytes=123456789")
    memory = record["memory"]
    # the held 300 MiB plus the interpreter, numpy and accelbench (under 200 MiB on every machine seen)
    assert 300 * MIB <= memory["host_peak_bytes"] <= 500 * MIB, memory
    assert "ru_maxrss" in memory["host_source"]
    assert memory["device_peak_bytes"] == 123456789 and memory["device_source"] == "the test's device_bytes option"
    for trial in record["trials"]:
        assert trial["process"]["peak_resident_bytes"] >= 300 * MIB


@pytest.mark.slow
def test_a_framework_that_says_nothing_of_its_device_gets_the_reason_not_a_figure(accelbench_cli, tmp_path):
    [record], done = run_sleepy(accelbench_cli, tmp_path)
    assert record["memory"]["device_peak_bytes"] is None
    assert record["memory"]["device_reason"] == "fixed-time does not report device memory"


def test_a_broken_device_report_is_a_missing_figure_with_its_reason_not_a_failed_run():
    class Raises:
        def device_memory(self):
            raise RuntimeError("no such counter")

    class Wrong:
        def device_memory(self):
            return {"peak": 1}

    assert _device_memory(Raises()).reason.startswith("device_memory() raised RuntimeError: no such counter")
    assert _device_memory(Wrong()).peak_bytes is None and "must return accelbench.DeviceMemory" in _device_memory(Wrong()).reason


@pytest.mark.slow
def test_without_energy_counters_the_record_says_why_and_the_table_says_it_once(accelbench_cli, tmp_path, monkeypatch):
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(tmp_path / "no-powercap"))
    [record], done = run_sleepy(accelbench_cli, tmp_path)
    assert record["energy"] == {
        "joules": None,
        "joules_per_image": None,
        "images_per_kwh": None,
        "source": None,
        "reason": f"no RAPL/powercap interface ({tmp_path / 'no-powercap'} is absent)",
    }
    assert done.stdout.count("no energy figure (J/image): no RAPL/powercap interface") == 1


@pytest.mark.slow
def test_joules_come_from_the_counters_advance_over_the_timed_steps_across_a_wrap(accelbench_cli, tmp_path, monkeypatch):
    # 2 trials x 10 timed steps x 0.25 J; the counter starts 1 J below its range, so it wraps
    root = fake_powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 9_000_000, 10_000_000)})
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(root))
    [record], _ = run_sleepy(accelbench_cli, tmp_path, "energy_uj_per_step=250000")
    spent = record["energy"]
    assert spent["joules"] == pytest.approx(2 * 10 * 0.25)
    assert [t["energy_j"] for t in record["trials"]] == pytest.approx([2.5, 2.5])
    images = record["throughput"]["images"]
    assert spent["joules_per_image"] == pytest.approx(5.0 / images)
    assert spent["images_per_kwh"] == pytest.approx(3.6e6 / (5.0 / images))
    assert spent["source"].startswith("RAPL intel-rapl:0 package-0")


@pytest.mark.slow
def test_lockstep_counts_the_energy_of_the_counted_blocks_only(accelbench_cli, tmp_path, monkeypatch):
    root = fake_powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 10**12)})
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(root))
    out = tmp_path / "ls.json"
    done = accelbench_cli(
        "run",
        "--plugin",
        "sleepy",
        "--plugin",
        "twin",
        "--schedule",
        "lockstep",
        "--trials",
        "2",
        "--blocks",
        "2",
        "--warmup-steps",
        "2",
        "--timed-steps",
        "6",
        "--when-busy",
        "go",
        "--option",
        "step_ms=5",
        "--option",
        "energy_uj_per_step=1000",
        "-o",
        str(out),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for record in load_records(out):
        # each block advances the counter by its own steps only (the other side is parked)
        steps = record["throughput"]["images"] / record["batch"]["global"]
        assert record["energy"]["joules"] == pytest.approx(steps * 1000 / 1e6)
        assert record["startup"]["trials"] == 2 and record["memory"]["host_peak_bytes"] > 0


def test_the_meter_counts_packages_and_dram_once_and_leaves_out_their_parts_and_the_platform(tmp_path, monkeypatch):
    root = fake_powercap(
        tmp_path / "powercap",
        {
            "intel-rapl:0": ("package-0", 5_000_000, 100_000_000),
            "intel-rapl:0:0": ("core", 1, 100_000_000),
            "intel-rapl:0:1": ("dram", 2_000_000, 100_000_000),
            "intel-rapl:1": ("psys", 7, 100_000_000),
        },
    )
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(root))
    meter = energy.Meter.find(gpus=False)
    assert [c.name for c in meter.counters] == ["RAPL intel-rapl:0 package-0", "RAPL intel-rapl:0:1 dram"]
    before = meter.read()
    (root / "intel-rapl:0" / "energy_uj").write_text("1000000")  # wrapped: 95 J to the range, then 1 J
    (root / "intel-rapl:0:1" / "energy_uj").write_text("3000000")
    assert meter.between(before, meter.read()).joules == pytest.approx(96 + 1)


def test_an_unreadable_counter_is_named_in_the_reason(tmp_path, monkeypatch):
    root = fake_powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 5, 100)})
    (root / "intel-rapl:0" / "energy_uj").write_text("not a number")
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(root))
    used = energy.Meter.find(gpus=False).between(None, None)
    assert used.joules is None and used.reason.startswith("RAPL zones intel-rapl:0 not readable")


@pytest.mark.slow
def test_start_up_counts_from_the_workers_start_through_prepare_to_the_first_steps_end(accelbench_cli, tmp_path):
    [record], done = run_sleepy(accelbench_cli, tmp_path, "prepare_s=1.5", "slow_first=1")
    for trial in record["trials"]:
        startup = trial["startup"]
        assert startup["worker_to_first_step_s"] >= 1.5 + startup["first_step_s"]
        assert startup["first_step_s"] >= 5 * 0.005  # the first step is 5 times as slow
        assert startup["warmup_s"] >= startup["first_step_s"] + 2 * 0.005
    summary = record["startup"]
    assert summary["trials"] == 2 and summary["worker_to_first_step_s"] >= 1.5
    assert "start-up" in done.stdout


def test_sessions_and_one_epoch_train_runs_say_why_they_have_no_start_up_or_energy():
    from accelbench.execution.runner import TRAIN_MODE_NOTES
    from accelbench.execution.session import SESSION_NOTES
    from accelbench.execution.timing import Timing
    from accelbench.records.results import TrialOutcome

    timing = Timing([0.1], 0.1, 1, 1)
    outcomes = [TrialOutcome("ok", "", timing, footprint_notes=SESSION_NOTES)]
    assert footprint.energy_of(outcomes, 8).reason == SESSION_NOTES["energy"]
    outcomes = [TrialOutcome("ok", "", timing, footprint_notes=TRAIN_MODE_NOTES)]
    assert footprint.energy_of(outcomes, 8).reason == TRAIN_MODE_NOTES["energy"]


def test_a_multi_worker_trial_sums_its_workers_peaks_and_does_not_add_up_machine_wide_counters():
    from accelbench.execution.multiworker import merge
    from accelbench.execution.timing import ProcessUsage, Timing
    from accelbench.records.results import TrialOutcome

    def rank(peak, wall, first):
        usage = ProcessUsage(1.0, 0.1, 0, peak_resident_bytes=peak)
        return TrialOutcome(
            "ok",
            "",
            Timing([wall], wall, 1, 1, usage=usage, energy=energy.EnergyUse(10.0, "RAPL intel-rapl:0 package-0")),
            device_memory=DeviceMemory(peak // 2, "counter"),
            startup=footprint.Startup(first, 0.5, 1.0),
        )

    merged = merge([rank(100 * MIB, 2.0, 3.0), rank(120 * MIB, 1.0, 4.0)])
    memory = footprint.memory_of([merged])
    assert memory.host_peak_bytes == 220 * MIB and memory.host_source.startswith("the sum of the 2 workers'")
    assert memory.device_peak_bytes == 60 * MIB
    assert footprint.energy_of([merged], 16).joules is None
    assert footprint.startup_of([merged]).worker_to_first_step_s == 4.0


def test_nvml_counts_each_visible_gpus_total_energy_in_millijoules(monkeypatch, tmp_path):
    import sys
    import types

    readings = {0: [1000, 5000], 1: [0, 0], 2: [10_000, 12_500]}
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetTotalEnergyConsumption=lambda handle: readings[handle][0],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(tmp_path / "none"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")
    meter = energy.Meter.find(gpus=True)
    assert [c.name for c in meter.counters] == ["NVML GPU 0", "NVML GPU 2"]
    before = meter.read()
    for values in readings.values():
        values.reverse()
    used = meter.between(before, meter.read())
    assert used.joules == pytest.approx((4000 + 2500) / 1e3)
    assert used.source.startswith("NVML GPU 0, NVML GPU 2: whole devices") and "RAPL/powercap" in used.source


@pytest.mark.slow
def test_price_per_kwh_prices_the_measured_energy_and_the_report_shows_it_beside_start_up_and_memory(
    accelbench_cli, tmp_path, monkeypatch
):
    root = fake_powercap(tmp_path / "powercap", {"intel-rapl:0": ("package-0", 0, 10**12)})
    monkeypatch.setenv(energy.POWERCAP_ROOT_VARIABLE, str(root))
    [record], done = run_sleepy(
        accelbench_cli, tmp_path, "energy_uj_per_step=250000", "device_bytes=2147483648", extra=("--price-per-kwh", "0.30")
    )
    priced = record["cost"]["energy"]
    per_image = record["energy"]["joules_per_image"] / 3.6e6 * 0.30
    assert priced["per_image"] == pytest.approx(per_image) and priced["price_per_kwh"] == 0.30
    assert priced["per_epoch"] == pytest.approx(per_image * 1_281_167)
    report = accelbench_cli("report", str(tmp_path / "out.json"), "--out", str(tmp_path / "report"), "--price-per-kwh", "0.30")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Start-up, memory and energy" in page and "<td>2.00</td>" in page  # the device's 2 GiB
    assert f"{priced['per_epoch']:,.2f} USD at 0.3/kWh" in page
    assert (tmp_path / "report" / "w0-startup_and_memory.png").stat().st_size > 0


def test_a_price_per_kwh_that_is_not_positive_is_refused_before_any_worker_starts(accelbench_cli, tmp_path):
    done = accelbench_cli("run", "--backend", "sleepy:fixed-time", "--price-per-kwh", "0", "-o", str(tmp_path / "x.json"))
    assert done.returncode == 2 and done.stderr.strip() == "error: --price-per-kwh must be positive, got 0"
    assert not (tmp_path / "x.json").exists()


def test_a_record_without_an_energy_figure_gets_an_energy_price_with_the_reason():
    from conftest import a_record

    from accelbench.analysis import cost
    from accelbench.records.blocks import EnergyCost
    from accelbench.records.footprint import Energy

    block = cost.energy_cost_block(a_record(energy=Energy(None, None, None, None, reason="no RAPL")), 0.3)
    assert block == EnergyCost(0.3, "USD", None, None, reason="no RAPL")
    assert str(cost.energy_cost_block(a_record(energy=None), 0.3).reason).startswith("the record has no energy figure")
