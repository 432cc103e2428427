"""One way to do each thing in schema/: the blocks take_next and take_locked share (the claim position's
equal to its definition, queue._claim_position and queue._claim_hint), and those take_locked
and consume share, stay the same text (a call to a shared helper costs more than the copy on the hot
path: docs/decisions.md), the move to
history is written only in queue._history_row, and stage settings are read only by queue._settings's
<settings> block or its inline copies on the hot path, and by the producers' <producer access> block."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FUNCTIONS = Path(__file__).resolve().parents[2] / "schema" / "functions"
SHARED = ("claim position", "claim from the beginning", "claim hint")


def _block(function: str, name: str) -> str:
    text = (FUNCTIONS / f"{function}.sql").read_text()
    match = re.search(rf"-- <{name}>[^\n]*\n(.*?)-- </{name}>", text, re.S)
    assert match, f"{function}.sql has no block <{name}> … </{name}>"
    return match.group(1).replace(f"{function}.", "<function>.").replace(f"'{function}'", "'<function>'")


@pytest.mark.parametrize("name", SHARED)
def test_take_next_and_take_locked_share_the_block(name: str) -> None:
    assert _block("take_next", name) == _block("take_locked", name)


@pytest.mark.parametrize(("name", "definition"), (("claim position", "_claim_position"), ("claim hint", "_claim_hint")))
def test_the_claim_position_inline_is_its_definition(name: str, definition: str) -> None:
    """The text of skiplock.claim_hint is defined once, by queue._claim_position and
    queue._claim_hint: take_next and take_locked carry their blocks inline (a call costs more)."""
    assert _block("take_next", name) == _block(definition, name)


@pytest.mark.parametrize("function", ("consume", "drain"))
def test_take_locked_consume_and_drain_share_their_checks(function: str) -> None:
    assert _block("take_locked", "take checks") == _block(function, "take checks")


def test_the_move_to_history_is_written_once() -> None:
    writers = sorted(p.name for p in FUNCTIONS.glob("*.sql")
                     if re.search(r"INSERT INTO queue\.history\s*\(", p.read_text()))
    assert writers == [], f"column-list INSERTs into queue.history (use queue._history_row): {writers}"
    users = [p.name for p in FUNCTIONS.glob("*.sql") if "INSERT INTO queue.history" in p.read_text()]
    for name in users:
        for insert in re.findall(r"INSERT INTO queue\.history\s*\n\s*SELECT[^\n]*", (FUNCTIONS / name).read_text()):
            assert "queue._history_row(" in insert, f"{name}: {insert.strip()}"


INLINE_SETTINGS = ("take_next", "take_locked", "consume", "drain")


@pytest.mark.parametrize("function", INLINE_SETTINGS)
def test_the_hot_path_inlines_the_settings_lookup_of_settings(function: str) -> None:
    assert "queue._settings(" not in (FUNCTIONS / f"{function}.sql").read_text()
    assert _block(function, "settings") == _block("_settings", "settings")


def test_enqueue_and_enqueue_batch_share_the_access_test() -> None:
    # They need only the stage's restricted flag ('*' never is): one probe, not _settings's two.
    def access(function: str) -> str:  # the right both test is called 'enqueue'
        return _block(function, "producer access").replace("'<function>'", "'enqueue'")
    assert access("enqueue") == access("enqueue_batch")
    assert "stage_settings" not in re.sub(r"-- <producer access>.*?-- </producer access>", "",
                                          (FUNCTIONS / "enqueue.sql").read_text(), flags=re.S)


def test_stage_settings_are_read_only_by_settings() -> None:
    # A statement that locks the row (FOR UPDATE, before changing it) is not a lookup.
    # reap_hung reads it inside its statement over live_tasks, where Citus runs no function that queries.
    def outside_the_block(p: Path) -> str:
        text = re.sub(r"-- <settings>.*?-- </settings>", "", p.read_text(), flags=re.S)
        return re.sub(r"-- <producer access>.*?-- </producer access>", "", text, flags=re.S)
    readers = sorted(p.name for p in FUNCTIONS.glob("*.sql") if p.name != "reap_hung.sql"
                     for statement in re.findall(r"FROM queue\.stage_settings\b[^;]*;", outside_the_block(p))
                     if "FOR UPDATE" not in statement)
    assert readers == [], f"functions that read queue.stage_settings themselves (use queue._settings): {readers}"


def test_the_runs_counted_without_history_have_one_key() -> None:
    # queue.finished_counts is keyed by the minute of _count_minute and the backend's pid: a writer
    # either calls it or (inside a statement, where Citus runs no function that queries, or on the
    # finish path, where a call costs) writes its expression out.
    minute = re.search(r"SELECT (pg_catalog\.date_bin\([^\n]*\))\n", (FUNCTIONS / "_count_minute.sql").read_text())
    assert minute
    writers = [p for p in FUNCTIONS.glob("*.sql")
               if re.search(r"(INSERT INTO|UPDATE) queue\.finished_counts\b", p.read_text()) and p.name != "_fold_counts.sql"]
    assert sorted(p.name for p in writers) == ["_count_runs.sql", "consume.sql", "drain.sql", "finish.sql",
                                               "finish_batch.sql", "finish_locked.sql", "reap_hung.sql"]
    for p in writers:
        text = p.read_text()
        assert "queue._count_minute()" in text or minute.group(1) in text, p.name
        assert "pg_catalog.pg_backend_pid()" in text, p.name


def _normal(sql: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"--[^\n]*", "", sql)).strip()


GUARDED = sorted((p.stem, m.group(1)) for p in FUNCTIONS.glob("*.sql")
                 for m in re.finditer(r"-- <(arguments|take checks)>[^\n]*\n(?:\s*--[^\n]*\n)*    IF [^\n]*\n(?:[^\n]*\n)*?\s*v_bad := CASE",
                                      p.read_text()))


def test_the_hot_functions_guard_their_argument_case() -> None:
    assert {"enqueue", "finish", "finish_locked", "take_next", "take_locked", "consume", "drain"} <= {f for f, _ in GUARDED}


@pytest.mark.parametrize(("function", "block"), GUARDED)
def test_the_argument_guard_is_its_case_joined(function: str, block: str) -> None:
    """A hot function's argument block may put before its CASE the same tests joined by OR (a text
    CASE costs more a call than a boolean OR: docs/decisions.md); the two say the same."""
    text = _block(function, block)
    guard = re.search(r"^    IF (.*?) THEN\n", text, re.S | re.M)
    case = re.search(r"v_bad := CASE (.*?) END;", text, re.S)
    assert guard and case, f"{function}: no guard IF or no v_bad CASE in <{block}>"
    tests = [_normal(t) for t in re.findall(r"WHEN (.*?)\s+THEN '[^']*'", case.group(1), re.S)]
    assert _normal(guard.group(1)) == " OR ".join(tests)
