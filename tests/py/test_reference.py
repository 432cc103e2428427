"""docs/reference.md is generated from the catalog (`make docs`): it must match what head builds."""

from __future__ import annotations

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
