"""Every relative link in the Markdown docs resolves: the file exists, and a #anchor names a
heading of it (GitHub's slugs). No database."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from skiplock.sqlfiles import ROOT

DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "clients" / "README.md",
               *(ROOT / "docs").glob("*.md"), *(ROOT / "bench").glob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def prose(text: str) -> str:
    """The text outside code blocks and code spans, where a link is a link."""
    return CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return frozenset(found)


def broken_links(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(prose(path.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading with that anchor")
    return broken


@pytest.mark.parametrize("path", [p for p in DOCS if p.exists()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == [], f"broken links in {path.relative_to(ROOT)}"


def test_the_slugs_follow_github() -> None:
    assert slug("Running SQL tasks (pg_task style)") == "running-sql-tasks-pg_task-style"
    assert slug("Tenants: per-stage access") == "tenants-per-stage-access"
    assert slug("`take_locked` marks the stage as waited on") == "take_locked-marks-the-stage-as-waited-on"
