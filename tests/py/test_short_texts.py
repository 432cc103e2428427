"""The texts in schema/ stay short and do not go stale (style.md, "Comments"). No database.

- A file's header (its leading `--` block) is at most 14 lines: what the object does, its
  parameters and result, what it locks and writes, what it raises. Rationale goes to
  docs/decisions.md.
- No comment and no COMMENT ON text cites what goes stale: a benchmark figure (µs, tasks/s, a
  percentage of a run, a workload name such as W2b, a pointer to the performance notes), a
  revision number or a seed. Settings and limits are not figures: `lock_timeout (100 ms)`,
  `interval '5 minutes'` and `plus or minus 10 %` pass.

The length of each COMMENT ON text (at most 250 characters) is checked on the migrated database
by tests/sql/002_short_texts.sql.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

SCHEMA = Path(__file__).resolve().parents[2] / "schema"
HEADER_LINES = 14
DIRECTIVE = re.compile(r"^-- (squawk-ignore)\b")

# Each pattern names one kind of stale text; keep them precise rather than broad.
STALE = {
    "revision number": re.compile(r"\brevisions? \d{4}\b", re.I),
    "seed reference": re.compile(r"\bseeds?\b", re.I),
    "microseconds": re.compile(r"µs"),
    "throughput figure": re.compile(r"\d ?(?:k )?(?:jobs|tasks|claims|takes|finishes|calls|enqueues)/s\b"),
    "share of a run": re.compile(r"\d ?% (?:of|faster|slower|fewer|more|less)\b"),
    "timing of a run": re.compile(r"\d ?(?:ms|s|µs) (?:a|per|each) (?:call|take|finish|claim|scrape|task)\b"),
    "before/after figure": re.compile(r"\d ?(?:ms|s) (?:before|after)\b|\bbefore, \d"),
    "what a run cost": re.compile(r"\b(?:took|cost)\b[^.;]{0,30}?\d"),
    "workload name": re.compile(r"\bW\d+[a-z]?\b"),
    "pointer to measurements": re.compile(r"performance(?:-log)?\.md|bench/\S+\.md|RESULTS\.md"),
}

COMMENT_ON = re.compile(r"COMMENT ON [^']*? IS\s*'((?:[^']|'')*)'")


def schema_files() -> list[Path]:
    files = sorted(SCHEMA.rglob("*.sql"))
    assert len(files) > 50, f"schema/ not found at {SCHEMA}"
    return files


def header(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        if not DIRECTIVE.match(line):
            lines.append(line)
    return lines


def line_comment(line: str) -> str | None:
    """The `--` comment of a line, when the `--` is not inside a string literal."""
    start = 0
    while (i := line.find("--", start)) >= 0:
        if line.count("'", 0, i) % 2 == 0:
            return line[i + 2:]
        start = i + 2
    return None


def texts(path: Path) -> list[tuple[str, str]]:
    """(where, text) for every comment and COMMENT ON text of a file."""
    found = []
    source = path.read_text()
    for number, line in enumerate(source.splitlines(), 1):
        comment = line_comment(line)
        if comment is not None:
            found.append((f"{path.relative_to(SCHEMA.parent)}:{number}", comment))
    for match in COMMENT_ON.finditer(source):
        number = source.count("\n", 0, match.start()) + 1
        found.append((f"{path.relative_to(SCHEMA.parent)}:{number} (COMMENT ON)", match.group(1).replace("''", "'")))
    return found


def stale(text: str) -> list[str]:
    return [name for name, pattern in STALE.items() if pattern.search(text)]


def test_headers_are_short() -> None:
    long = {str(p.relative_to(SCHEMA.parent)): n for p in schema_files() if (n := len(header(p))) > HEADER_LINES}
    assert not long, f"headers over {HEADER_LINES} lines (move the rationale to docs/decisions.md): {long}"


def test_every_function_file_has_a_header() -> None:
    bare = [p.name for p in sorted((SCHEMA / "functions").glob("*.sql")) if not header(p)]
    assert not bare, f"function files without a header: {bare}"


def test_no_comment_cites_what_goes_stale() -> None:
    hits = [f"{where}: {', '.join(kinds)}: {text.strip()}"
            for path in schema_files() for where, text in texts(path) if (kinds := stale(text))]
    assert not hits, "comments that go stale (move them to docs/decisions.md or CHANGELOG.md):\n" + "\n".join(hits)


@pytest.mark.parametrize("text", [
    "the helper's call cost 2.5 % of a take and finish",
    "a second one cost W2b about 10 % of its throughput",
    "7 µs of a 76 µs call",
    "The signature gained retry_in in revision 0019",
    "the seed's re-run of a changed task",
    "periodic task (seed 001, seed 002's repeat)",
    "100 tenants of 1,000 tasks took 2.9 s before, 0.1 s after",
    "W2b went from 31.1k to 34.7k jobs/s at 16 clients",
    "3.6 ms a take behind 500 held tasks",
    "see docs/performance.md",
])
def test_the_patterns_catch_figures(text: str) -> None:
    assert stale(text)


@pytest.mark.parametrize("text", [
    "take_next(stage => 'resize', lease_for => interval '5 minutes')",
    "It waits at most lock_timeout (100 ms) for the lock and raises 55P03",
    "Random spread of the retry delay, as a fraction of it (0.1 = plus or minus 10 %)",
    "a lease covers the task's timeout plus 30 s",
    "each at most once per 5 s",
    "at most 50,000 live tasks; a take reads at most batch + 1,000 candidates",
    "waits at most 1 s for the executor's CALL to return",
    "1, 2, 3, 4, 6, 8 or 12 hours, 1 day or 7 days",
    "a helper function's call costs more than the copy",
])
def test_the_patterns_pass_settings_and_limits(text: str) -> None:
    assert not stale(text)
