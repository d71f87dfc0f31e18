"""The README, the documentation site and the figures it shows: the README stays a short read
whose commands parse, the site builds strictly, every measured figure on it is rendered from a
committed results file, and the terminal's tables keep their key columns at 80 and 100 columns."""

import copy
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from accelbench.analysis import compare as comparing
from accelbench.analysis import evidence
from accelbench.authoring import docgen
from accelbench.cli import cli
from accelbench.cli.console import ComparisonTable, ResultsTable, TrainingTable
from accelbench.records import results as records

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()


def test_the_readme_is_a_ten_minute_read():
    lines = README.splitlines()
    assert len(lines) <= 250
    assert "pip install -e '.[all]' && accelbench peak && accelbench run" in lines[4]
    assert lines[6].endswith("pip install -e '.[all,test]' && pip check && python tests/lint.py && pytest")
    # measurements are data: no dated log in the README
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\bUTC\b", README)


def readme_commands():
    """Every ``accelbench ...`` command in the README's code blocks, as its argument list."""
    blocks = re.findall(r"```bash\n(.*?)```", README, re.S)
    commands = []
    for line in (line for block in blocks for line in block.splitlines()):
        if line.lstrip().startswith("#"):
            continue
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:1] == ["accelbench"]:
                commands.append(words[1:])
    return commands


@pytest.mark.parametrize("args", readme_commands(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_command_parses(args):
    """The command's options all exist and take the values given (a dry form: click parses them
    into a context, nothing runs)."""
    command = cli.get_command(None, args[0])
    assert command is not None, args[0]
    context = command.make_context(args[0], list(args[1:]), resilient_parsing=False)
    assert context.params is not None


def test_the_readme_has_the_tour_a_newcomer_needs():
    assert len(readme_commands()) >= 6
    for topic in (
        "accelbench compare",
        "accelbench report",
        "pytest --pyargs accelbench.benchmarks",
        "register_backends",
        "[project.entry-points.accelbench]",
        "mkdocs",
    ):
        assert topic in README, topic


def copy_of_the_site(tmp_path):
    """The docs and what they render, in a folder of their own (so a test can break a file)."""
    site = tmp_path / "project"
    site.mkdir()
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, site / name)
    for name in ("docs", "benchmarks", "schemas"):
        shutil.copytree(ROOT / name, site / name)
    return site


def build(site, out):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=site,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_generated_part(tmp_path):
    done = build(copy_of_the_site(tmp_path), tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    page = lambda name: (tmp_path / "site" / name / "index.html").read_text()  # noqa: E731
    shown = page("evidence")
    for path in sorted(RESULTS.rglob("*.json")):
        assert path.stem in shown
    assert "register_backends" in page("plugins/api") and "BackendInfo" in page("plugins/api")
    assert "Called in the host" in page("plugins/writing")
    assert "config_hash" in page("records") and "SHA-256" in page("records")
    assert "Keep a Changelog" in page("changelog")


def test_a_results_file_that_cannot_stand_as_evidence_fails_the_build_by_its_path(tmp_path):
    site = copy_of_the_site(tmp_path)
    broken = site / "benchmarks" / "results" / "some-machine" / "2026-01-01-broken.json"
    broken.parent.mkdir()
    broken.write_text('{"schema_version": "1.1.0", "records": []}')
    done = build(site, tmp_path / "site")
    assert done.returncode != 0
    assert "2026-01-01-broken.json" in done.stderr + done.stdout


def a_results_file(tmp_path):
    # evidence made by today's methods (a superseded one would stop the build: test_core_units)
    [source] = [p for p in sorted(RESULTS.rglob("*.json")) if p.stem.endswith("until-decided-1")]
    folder = tmp_path / "results" / "a-machine"
    folder.mkdir(parents=True)
    return shutil.copy(source, folder / "2026-12-06-case.json")


def test_a_figure_edited_in_a_file_changes_the_rendered_page(tmp_path):
    path = Path(a_results_file(tmp_path))
    before = evidence.markdown(evidence.load(tmp_path / "results"), tmp_path / "results")
    document = json.loads(path.read_text())
    old = document["records"][0]["throughput"]["images_per_sec"]
    document["records"][0]["throughput"]["images_per_sec"] = 123.456
    path.write_text(json.dumps(document))
    after = evidence.markdown(evidence.load(tmp_path / "results"), tmp_path / "results")
    assert f"{old:.2f}" in before and "123.46" not in before
    assert "123.46" in after
    assert "## a-machine" in after and "AMD EPYC" in after and "accelbench run" in after


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda d: d.pop("command"), "no command"),
        (lambda d: d["records"][0]["environment"].update(cpu_flags=[]), "lacks its machine"),
        (lambda d: d["records"][0].pop("status"), "not a valid results file"),
    ],
)
def test_evidence_without_its_machine_or_command_or_schema_is_refused_by_path(tmp_path, spoil, says):
    path = Path(a_results_file(tmp_path))
    document = json.loads(path.read_text())
    spoil(document)
    path.write_text(json.dumps(document))
    with pytest.raises(evidence.EvidenceError, match=says) as refused:
        evidence.load(tmp_path / "results")
    assert str(refused.value).startswith(str(path))


def test_report_prints_the_evidence_as_markdown(tmp_path):
    a_results_file(tmp_path)
    from click.testing import CliRunner

    done = CliRunner().invoke(cli, ["report", "--evidence", str(tmp_path / "results"), "--markdown"])
    assert done.exit_code == 0, done.output
    assert "| A / B | ratio | interval |" in done.output and "undecided" in done.output


def test_every_schema_field_is_described():
    for name in ("result", "results"):
        table = docgen.schema_table(name)
        rows = [line for line in table.splitlines() if line.startswith("| `")]
        assert rows and [row for row in rows if row.rstrip().endswith("|  |")] == []


def narrow_records():
    rs = records.read_results(next(p for p in sorted(RESULTS.rglob("*.json")) if p.stem.endswith("lockstep-hog")))
    failed = dataclasses.replace(
        copy.deepcopy(rs[0]), status="unavailable", reason="bf16 needs AVX-512", throughput=None, step_time=None, flops=None
    )
    failed.plugin.name = "tpu_official"
    return rs + [failed]


@pytest.mark.parametrize("width", [80, 100])
def test_key_columns_are_never_cut_at_80_and_100_columns(width):
    rs = narrow_records()
    out = Console(width=width, record=True, emoji=False)
    ResultsTable(rs).print(out)
    ComparisonTable(comparing.comparisons(comparing.runs_of(rs), 0.03), 0.03).print(out)
    text = out.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "device" not in text.splitlines()[2]  # folded: the key columns only
    assert "…" not in text
    for r in rs:
        row = next(line for line in text.splitlines() if f"{r.plugin.name}:resnet50 " in line and "│" in line)
        assert r.status in row
        if r.throughput:
            tp = r.throughput
            assert f"{tp.images_per_sec:.2f}" in row and f"{tp.ci95[0]:.2f}–{tp.ci95[1]:.2f}" in row
    for cell in ("mxnet_ngc:resnet50", "tf_benchmarks:resnet50", "0.311", "0.145–0.667", "undecided"):
        assert cell in text
    # what did not fit is folded under its row, not lost
    assert "step median" in text and "GFLOP/s" in text and "verdict withheld" in text


def test_wide_keeps_every_column_and_a_wide_console_needs_no_folding():
    rs = narrow_records()
    for out, wide in ((Console(width=80, record=True), True), (Console(width=250, record=True), False)):
        ResultsTable(rs, wide=wide).print(out)
        header = next(line for line in out.export_text().splitlines() if "backend" in line and "┃" in line)
        assert "device" in header and "GFLOP/s" in header


def test_the_training_table_keeps_its_key_columns_at_80():
    out = Console(width=80, record=True)
    TrainingTable(narrow_records()).print(out)
    header = " ".join(out.export_text().splitlines()[:4])
    assert "backend" in header and "status" in header and "time to" in header
