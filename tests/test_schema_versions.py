"""Records written by every earlier result-schema version still validate, compare and report.

The fixtures are real results files, each written by accelbench at the commit that introduced its
schema version (a two-point batch sweep of the fixed-time test backend, 2 trials each): 1.0-1.3
when those versions were current, 1.4-1.11 on 2026-12-06 from each commit's own code and test
plugins (`git archive` of the commit, run with its package first on PYTHONPATH; 1.11 from 9ff3707,
in lockstep, the default for a sweep by then; 1.12 on 2026-12-07 from a20df3b the same way). Their intervals
over two trials are the percentile bootstrap of their day, which 1.10 replaced (1.10's own is the
t-interval).
"""

import json
from pathlib import Path

import pytest

from accelbench.records import validation

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = [
    "1.0.0",
    "1.1.0",
    "1.2.0",
    "1.3.0",
    "1.4.0",
    "1.5.0",
    "1.6.0",
    "1.7.0",
    "1.8.0",
    "1.9.0",
    "1.10.0",
    "1.11.0",
    "1.12.0",
]


def fixture(version: str) -> Path:
    return FIXTURES / f"records-{version}.json"


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_each_earlier_version_validates_under_the_current_schema(version, accelbench_cli):
    document = json.loads(fixture(version).read_text())
    assert document["schema_version"] == version
    assert {r["schema_version"] for r in document["records"]} == {version}
    assert all(validation.errors("result", r) == [] for r in document["records"])
    done = accelbench_cli("validate", str(fixture(version)))
    assert done.returncode == 0 and done.stdout.strip().endswith("ok (2 records)"), done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS[:-1])
def test_each_earlier_version_compares_with_the_latest(version, accelbench_cli):
    done = accelbench_cli("compare", str(fixture(version)), str(fixture(VERSIONS[-1])), "--json")
    assert done.returncode == 0, done.stderr
    comparisons = json.loads(done.stdout)["comparisons"]
    assert [c["config"].split(" batch ")[1].split()[0] for c in comparisons] == ["8", "16"]
    for c in comparisons:  # the same fixed-time backend, 5 ms steps, on one machine
        assert c["ratio"] == pytest.approx(c["a_images_per_sec"] / c["b_images_per_sec"])
        assert c["ratio"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
def test_every_version_reports_together(accelbench_cli, tmp_path):
    out = tmp_path / "report"
    done = accelbench_cli("report", *map(str, map(fixture, VERSIONS)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    page = (out / "index.html").read_text()
    assert page.count("sleepy:fixed-time") >= len(VERSIONS) * 2


def test_the_schemas_constrain_the_shape_of_names_not_their_values():
    record = json.loads(fixture(VERSIONS[-1]).read_text())["records"][0]
    record.update(model={"name": "any-model_2", "variant": "x.y"}, precision="tf32+", device={**record["device"], "kind": "npu"})
    assert validation.errors("result", record) == []
    record["precision"] = "two words"
    assert validation.errors("result", record) == ["$.precision: 'two words' does not match '^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$'"]


@pytest.mark.parametrize("version", VERSIONS)
def test_each_earlier_version_reads_into_the_typed_record(version):
    """Every version's records read into ``Record`` (keys absent from older versions read as
    None) and give back the same JSON they were read from."""
    from accelbench.records.results import ResultsDocument

    document = json.loads(fixture(version).read_text())
    read = ResultsDocument.from_json(document)
    assert [r.schema_version for r in read.records] == [version, version]
    assert [r.batch.global_ for r in read.records] == [8, 16]
    assert all(r.ok and r.throughput and r.throughput.images_per_sec > 0 for r in read.records)
    assert read.to_json() == document


def test_a_key_no_version_declares_is_named(tmp_path):
    from accelbench.records.jsonform import FormError
    from accelbench.records.results import Record

    record = json.loads(fixture(VERSIONS[-1]).read_text())["records"][0]
    with pytest.raises(FormError, match=r"Record.throughput: unexpected key 'speed'"):
        Record.from_json({**record, "throughput": {**record["throughput"], "speed": 1}})
    with pytest.raises(FormError, match=r"Record.trials\[0\].images: expected int, got str"):
        Record.from_json({**record, "trials": [{**record["trials"][0], "images": "40"}]})
    with pytest.raises(TypeError, match=r"record\.status"):
        Record.from_json(record)["status"]
