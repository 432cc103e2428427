"""docs/reference.md is generated from the catalog (`make docs`): it must match what head builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from skiplock import reference
from skiplock.sqlfiles import ROOT


def test_committed_reference_is_current(db: str) -> None:
    committed = (ROOT / "docs" / "reference.md").read_text()
    assert committed == reference.build(db), reference.STALE_MESSAGE


def test_reference_lists_the_api_not_the_helpers(db: str) -> None:
    text = reference.build(db)
    assert "### queue.take_next\n" in text
    assert "### queue.stats\n" in text
    assert "### queue._settings\n" not in text  # internal helpers are only named, at the end
    assert "- `queue._settings(" in text


def test_the_command_writes_and_checks(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skiplock import cli
    out = tmp_path / "reference.md"
    assert cli.main(["docs", "--db", db, "--output", str(out)]) == 0
    assert out.read_text() == reference.build(db)
    assert cli.main(["docs", "--db", db, "--output", str(out), "--check"]) == 0
    out.write_text(out.read_text() + "edited by hand\n")
    assert cli.main(["--db", db, "docs", "--output", str(out), "--check"]) == 1
    assert reference.STALE_MESSAGE in capsys.readouterr().err
