"""The lint step (`tests/lint.py`, run before the suite) can fail, and the type checker holds
records to their attributes. The whole tree is checked by the step itself, not here."""

import subprocess

import lint
import pytest


def test_ruff_with_the_projects_rules_finds_an_unused_import_and_unformatted_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nx = {'a':1}\n")
    config = ("--config", str(lint.ROOT / "pyproject.toml"))
    found = subprocess.run([lint.ruff_executable(), "check", *config, str(probe)], capture_output=True, text=True)
    assert found.returncode == 1 and "F401" in found.stdout, found.stdout
    formatted = subprocess.run([lint.ruff_executable(), "format", "--check", *config, str(probe)], capture_output=True, text=True)
    assert formatted.returncode == 1 and "1 file would be reformatted" in formatted.stdout, formatted.stdout


def test_the_lint_step_stops_at_the_first_check_that_fails_and_says_which(monkeypatch, capsys):
    failed = subprocess.CompletedProcess([], 1, "Would reformat: core/x.py\n", "")
    monkeypatch.setattr(
        lint, "ruff", lambda *args: failed if args == ("format", "--check") else subprocess.CompletedProcess([], 0)
    )
    monkeypatch.setattr(lint, "mypy", lambda *args: pytest.fail("mypy ran after a failed check"))
    assert lint.main() == 1
    printed = capsys.readouterr().out
    assert printed.startswith("lint: ruff check: ok\nlint: ruff format --check: failed (exit 1)\n") and "core/x.py" in printed


def test_a_record_indexed_by_a_string_key_is_a_type_error(tmp_path):
    """Records are typed end to end: the type checker refuses ``record["status"]`` wherever it
    is written (and at run time it raises, naming the attribute)."""
    (lint.installed_layout(tmp_path) / "consumer.py").write_text(
        "from accelbench.records.results import read_results\n\n"
        "for record in read_results('r.json'):\n"
        "    print(record.status, record['status'])\n"
    )
    done = lint.mypy(tmp_path, "consumer.py")
    assert done.returncode == 1 and 'consumer.py:4: error: Invalid index type "str" for "Record"' in done.stdout, done.stdout
