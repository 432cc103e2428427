"""Hostile input to every public function of schema queue: each call either works or raises a
SQLSTATE that docs/errors.md documents for that function, and a call that raises changes nothing.

The functions are read from pg_proc, not listed here, so a new function cannot be forgotten: its
arguments get the hostile values of their types, a type without hostile values fails the test,
and a required argument without a known valid value (BASELINE) fails it too. Hostile values:
quotes, `;`, `$$`, `"`, backslashes, control characters (no NUL: PostgreSQL text cannot hold
it), unicode, 54- and 55-byte names, 1 MB strings; JSON nested 10,000 deep (PostgreSQL accepts
it) and 100,000 deep (refused while reading the argument: stack depth), 1 MB strings, 200,000
element arrays; extreme numbers, intervals, timestamps, arrays.

An error that PostgreSQL raises while reading the argument (e.g. 22P02 for a lease that is not a
UUID, 54001 for JSON nested too deep) is accepted when the bare cast `SELECT value::type` raises it
too: then no function ran. Before every call the queue tables are restored to a baseline (a
ready task, a running one, finished ones), and their contents are compared before and after.

A static check: every EXECUTE in schema/functions builds its SQL with format() and only %I/%L.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterator

import psycopg
import pytest

from dev import testrun

ROOT = Path(__file__).resolve().parents[2]
ERRORS_MD = ROOT / "docs" / "errors.md"
FUNCTIONS_DIR = ROOT / "schema" / "functions"
MB = 1 << 20

# -- hostile values, by SQL type -----------------------------------------------------------------
HOSTILE_TEXT: dict[str, str | None] = {
    "NULL": None,
    "empty": "",
    "star": "*",
    "space": " ",
    "quote": "it's",
    "semicolon": "a'); DROP TABLE queue.live_tasks; --",
    "dollar": "$$ || pg_sleep(10) || $$",
    "double quote": '"quoted" name',
    "backslash": "back\\slash\\'",
    "control chars": "tab\tnl\ncr\r\x01\x1b[31m\x7f",
    "unicode": "ステージ-🚀-ß-\u202eRTL",
    "format specifiers": "%s %I %L %1$s",
    "54 bytes": "x" * 54,
    "55 bytes": "x" * 55,
    "54 bytes multibyte": "ス" * 18,
    "57 bytes multibyte": "ス" * 19,
    "1000 chars": "k" * 1000,
    "1001 chars": "k" * 1001,
    "1 MB": "x" * MB,
    "1 MB hostile": ("';$$\"\\\n" * (MB // 7 + 1))[:MB],
}


def nested(depth: int, kind: str) -> str:
    return ('{"a":' * depth + "1" + "}" * depth) if kind == "object" else ("[" * depth + "]" * depth)


HOSTILE_JSON: dict[str, str | None] = {
    "NULL": None,
    "json null": "null",
    "scalar number": "42",
    "scalar string": '"$$; DROP"',
    "empty object": "{}",
    "hostile keys": json.dumps({"'; DROP TABLE queue.live_tasks; --": "$$", '"\\': ["\x01", "ステ🚀"]}),
    "array depth 10,000": nested(10_000, "array"),
    "object depth 10,000": nested(10_000, "object"),
    "array depth 100,000": nested(100_000, "array"),
    "1 MB string": json.dumps({"s": "x" * MB}),
    "just under 1 MiB": json.dumps({"s": "x" * (MB - 200)}),
    "200,000 element array": json.dumps(list(range(200_000))),
}

HOSTILE: dict[str, dict[str, Any]] = {
    "text": HOSTILE_TEXT,
    "jsonb": HOSTILE_JSON,
    "jsonb[]": {
        "NULL": None,
        "empty": [],
        "NULL element": [None],
        "scalar element": ["{}", "42"],
        "hostile payloads": [v for k, v in HOSTILE_JSON.items()
                             if k in ("hostile keys", "array depth 10,000", "object depth 10,000",
                                      "just under 1 MiB", "1 MB string")],
        "100,001 payloads": ["{}"] * 100_001,
    },
    "text[]": {"NULL": None, "empty": [], "NULL element": [None],
               "hostile names": [v for v in HOSTILE_TEXT.values() if isinstance(v, str)],
               "star alone": ["*"], "1,001 stages": ["h.stage"] * 1_001},
    "integer": {"NULL": None, "min": -2**31, "max": 2**31 - 1, "zero": 0, "minus one": -1},
    "bigint": {"NULL": None, "minus one": -1, "zero": 0, "max": 2**63 - 1},
    "bigint[]": {"NULL": None, "empty": [], "NULL element": [None], "extremes": [-1, 0, 2**63 - 1],
                 "10,001 ids": list(range(10_001))},
    "uuid": {"NULL": None, "zero": "00000000-0000-0000-0000-000000000000", "not a uuid": "not-a-uuid'; --"},
    "uuid[]": {"NULL": None, "empty": [], "NULL element": [None], "not a uuid": ["x'; --"],
               "10,001 leases": ["00000000-0000-0000-0000-000000000000"] * 10_001},
    "interval": {"NULL": None, "negative": "-1 second", "zero": "0", "one microsecond": "1 microsecond",
                 "huge": "178000000 years", "huge negative": "-178000000 years"},
    "real": {"NULL": None, "NaN": "NaN", "infinity": "Infinity", "minus one": "-1", "two": "2"},
    "boolean": {"NULL": None, "true": True, "false": False},
    "regrole": {"NULL": None, "unknown": "no_such_role'; DROP TABLE queue.live_tasks; --",
                "quoted": '"Skiplock_Worker"', "public": "public", "empty": ""},
    "timestamp with time zone": {"NULL": None, "infinity": "infinity", "-infinity": "-infinity",
                                 "year 294276": "294276-12-31 00:00:00+00", "4713 BC": "4713-01-01 00:00:00+00 BC"},
}

# -- valid values for required arguments, by name -------------------------------------------------
# Filled in per run: "id" and "lease" are the baseline running task's; cancel/retry/set_priority
# get the ready task's id.
BASELINE: dict[str, Any] = {
    "stage": "h.stage", "stages": ["h.stage"], "payload": "{}", "payloads": ["{}"], "request": "SELECT 1", "pid": 1, "error": "boom", "next_stage": "h.next",
    "name": "h.schedule", "cron": "*/5 * * * *", "priority": 0, "role": "skiplock_worker", "now": "2030-01-01 00:00:00+00",
    "ids": [1], "results": ["{}"],
}
# Functions without arguments: nothing hostile to give, but each is still called once.
NO_ARGUMENTS = {"reap_hung", "cancel_overdue_sql_tasks", "compact", "distribute", "maintain_now", "workers"}

# SQLSTATEs a function raises that docs/errors.md does not list for it: (function, sqlstate) ->
# why. A gap here is a documentation (or function) bug reported to the owner; when it is fixed,
# the entry must go (the test fails on an entry that no longer happens).
# Raised but not (yet) in docs/errors.md: (function, SQLSTATE) -> how. Empty: errors.md lists them all.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


# -- docs/errors.md ------------------------------------------------------------------------------
def documented_sqlstates(functions: dict[str, list[tuple[str, str]]]) -> dict[str, set[str]]:
    """function -> SQLSTATEs docs/errors.md says it raises."""
    allowed: dict[str, set[str]] = defaultdict(set)
    rows = [line for line in ERRORS_MD.read_text().splitlines() if re.match(r"\|\s*`\w{5}`", line)]
    assert rows, "no SQLSTATE rows found in docs/errors.md"
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        code, raised_by = cells[0].strip("`"), cells[2]
        for fn, args in functions.items():
            named = re.search(rf"`{re.escape(fn.removesuffix('[]'))}\b", raised_by) is not None
            every = raised_by.strip().lower() == "all"
            lease = "lease" in raised_by.lower() and any(t in ("uuid", "uuid[]") for _, t in args)
            if named or every or lease:
                allowed[fn].add(code)
    return allowed


# -- the database --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_db(admin_url: str, template_db: str) -> Iterator[str]:
    url = testrun.create_database(admin_url, "hostile_input", template=template_db)  # alembic upgrade head: what we ship
    try:
        yield url
    finally:
        testrun.drop_database(admin_url, url)


def public_functions(conn: psycopg.Connection) -> dict[str, list[tuple[str, str]]]:
    """name -> [(argument, type)] of the IN arguments, for every public function of schema queue."""
    rows = conn.execute("""
        SELECT p.proname, p.pronargs, p.pronargdefaults, coalesce(p.proargnames, '{}'),
               array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t)
          FROM pg_proc p
         WHERE p.pronamespace = 'queue'::regnamespace AND p.proname !~ '^_' AND p.prokind = 'f'
         ORDER BY 1""").fetchall()
    functions: dict[str, list[tuple[str, str]]] = {}
    overloaded = {name for name, n in Counter(r[0] for r in rows).items() if n > 1}
    for name, nargs, ndefaults, argnames, argtypes in rows:
        # An overload whose first argument is an array (take_next(stages text[]), …) is "name[]".
        key = name + "[]" if name in overloaded and argtypes and argtypes[0].endswith("[]") else name
        assert key not in functions, f"overloaded public function {name}: extend this test"
        functions[key] = [(argnames[i], argtypes[i]) for i in range(nargs)]
        functions[key + "/required"] = functions[key][:nargs - ndefaults]  # type: ignore[assignment]
    return functions


def queue_tables(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute("""
        SELECT c.oid::regclass::text FROM pg_class c
         WHERE c.relnamespace = 'queue'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
           AND c.relname <> 'skiplock_version'
         ORDER BY 1""").fetchall()]


def snapshot(conn: psycopg.Connection) -> dict[str, Any]:
    """Count and checksum of every queue table, and the list of relations (DDL counts too)."""
    snap: dict[str, Any] = {"relations": conn.execute(
        "SELECT array_agg(relname::text ORDER BY relname) FROM pg_class"
        " WHERE relnamespace = 'queue'::regnamespace").fetchone()[0]}
    for table in queue_tables(conn):
        snap[table] = conn.execute(f"SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), ''))"
                                   f" FROM {table} t").fetchone()
    return snap


class Baseline:
    """The queue tables' contents at the start, restored before every call."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.rows = {t: conn.execute(f"SELECT coalesce(jsonb_agg(to_jsonb(t)), '[]') FROM {t} t").fetchone()[0]
                     for t in queue_tables(conn)}

    def restore(self) -> None:
        with self.conn.transaction():
            for table, rows in self.rows.items():
                self.conn.execute(f"DELETE FROM {table}")
                self.conn.execute(f"INSERT INTO {table} OVERRIDING SYSTEM VALUE"
                                  f" SELECT * FROM jsonb_populate_recordset(NULL::{table}, %s)",
                                  (json.dumps(rows),))


def call(conn: psycopg.Connection, fn: str, args: dict[str, tuple[str, Any]]) -> tuple[str, Any]:
    """Call queue.fn with named arguments {name: (type, value)}: ('ok', None) or ('error', exc)."""
    sql = "SELECT * FROM queue.{}({})".format(
        fn.removesuffix("[]"), ", ".join(f'"{name}" => %s::{typ}' for name, (typ, _) in args.items()))
    try:
        conn.execute(sql, [v for _, v in args.values()]).fetchall()
        return "ok", None
    except psycopg.Error as e:
        return "error", e


def rejected_by_cast(conn: psycopg.Connection, typ: str, value: Any, sqlstate: str) -> bool:
    """Whether reading the value as `typ` alone raises `sqlstate` (then the function never ran)."""
    try:
        conn.execute(f"SELECT %s::{typ}", [value]).fetchall()
        return False
    except psycopg.Error as e:
        return e.sqlstate == sqlstate


def test_hostile_input_to_every_public_function(hostile_db: str):
    with psycopg.connect(hostile_db, autocommit=True) as conn:
        conn.execute("SET statement_timeout = '60s'")
        # Baseline: a ready task with a key, a running one, one done, one fatal.
        ready = conn.execute("SELECT queue.enqueue(payload => '{\"r\": 1}'::jsonb, stage => 'h.stage',"
                             " key => 'k')").fetchone()[0]
        for n in range(3):
            conn.execute("SELECT queue.enqueue(payload => %s::jsonb, stage => 'h.work')", (json.dumps({"n": n}),))
        taken = conn.execute("SELECT id, lease::text FROM queue.take_next(stage => 'h.work', batch => 3,"
                             " lease_for => interval '1 hour', worker => 'baseline')").fetchall()
        assert len(taken) == 3
        conn.execute("SELECT queue.finish(%s, %s::uuid)", taken[1])
        conn.execute("SELECT queue.fail(%s, %s::uuid, 'bad', fatal => true)", taken[2])
        running_id, lease = taken[0]

        functions = public_functions(conn)
        names = sorted(f for f in functions if not f.endswith("/required"))
        allowed = documented_sqlstates({f: functions[f] for f in names})
        baseline = Baseline(conn)

        problems: list[str] = []
        gaps_seen: set[tuple[str, str]] = set()
        per_function: dict[str, int] = defaultdict(int)
        outcomes: dict[str, int] = defaultdict(int)

        def valid(fn: str, arg: str) -> Any:
            if arg in ("id", "finished_id"):
                return [running_id] if fn == "finish_batch" else \
                    ready if fn in ("cancel", "retry", "set_priority") else running_id
            if arg in ("lease", "finished_lease"):
                return [lease] if fn == "finish_batch" else lease
            if arg not in BASELINE:
                problems.append(f"{fn}: required argument {arg} has no valid value in BASELINE")
            return BASELINE.get(arg)

        def run(fn: str, args: dict[str, tuple[str, Any]], what: str, hostile_type: str | None,
                hostile_value: Any) -> None:
            baseline.restore()
            before = snapshot(conn)
            status, err = call(conn, fn, args)
            per_function[fn] += 1
            if status == "ok":
                outcomes["ok"] += 1
                return
            code = err.sqlstate
            after = snapshot(conn)
            if after != before:
                changed = [k for k in before if before[k] != after.get(k)]
                problems.append(f"{fn}({what}): raised {code} but changed {changed}")
            if code in allowed[fn]:
                outcomes[f"documented {code}"] += 1
            elif hostile_type is not None and rejected_by_cast(conn, hostile_type, hostile_value, code):
                outcomes[f"cast {code}"] += 1
            elif (fn, code) in KNOWN_GAPS:
                gaps_seen.add((fn, code))
                outcomes[f"known gap {code}"] += 1
            else:
                first = str(err).splitlines()[0][:200]
                problems.append(f"{fn}({what}): undocumented SQLSTATE {code}: {first}")

        for fn in names:
            args = functions[fn]
            required = functions[fn + "/required"]
            # Every argument with a known valid value gets it (so that, e.g., take_next works on
            # the baseline's stage); the others keep their defaults.
            base = {a: (t, valid(fn, a)) for a, t in args
                    if (a, t) in required or a in BASELINE or a in ("id", "lease", "finished_id", "finished_lease")}
            if not args:
                assert fn in NO_ARGUMENTS, f"{fn} takes no argument: add it to NO_ARGUMENTS"
                run(fn, {}, "no arguments", None, None)
                continue
            run(fn, base, "valid", None, None)
            for arg, typ in args:
                if typ not in HOSTILE:
                    problems.append(f"{fn}: argument {arg} of type {typ} has no hostile values: extend HOSTILE")
                    continue
                for label, value in HOSTILE[typ].items():
                    run(fn, {**base, arg: (typ, value)}, f"{arg} = {label}", typ, value)

        missing = [fn for fn in names if per_function[fn] < 2 and fn not in NO_ARGUMENTS]
        assert not missing, f"public functions without hostile-input cases: {missing}"
        stale = set(KNOWN_GAPS) - gaps_seen
        print(f"\n{sum(per_function.values())} calls to {len(names)} functions: {dict(sorted(outcomes.items()))}")
        assert not problems, "\n".join(problems[:60]) + (f"\n… {len(problems)} in all" if len(problems) > 60 else "")
        assert not stale, f"KNOWN_GAPS entries that no longer happen (remove them): {sorted(stale)}"


# -- static check: dynamic SQL -------------------------------------------------------------------
def strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def execute_statements(sql: str) -> list[str]:
    """The text of every PL/pgSQL EXECUTE statement (not GRANT EXECUTE), up to its ';' outside quotes."""
    out = []
    for m in re.finditer(r"(?<!GRANT )(?<!REVOKE )\bEXECUTE\b(?!\s+ON\b)", sql):
        i, quoted = m.end(), False
        while i < len(sql):
            ch = sql[i]
            if ch == "'":
                quoted = not quoted
            elif ch == ";" and not quoted:
                break
            i += 1
        out.append(sql[m.start():i])
    return out


def unsafe_execute(stmt: str) -> str | None:
    """Why an EXECUTE statement is unsafe, or None: it must be EXECUTE [pg_catalog.]format('…', …)
    with only %I, %L (and %%) in the literal, and no || outside string literals."""
    m = re.match(r"EXECUTE\s+(?:pg_catalog\.)?format\s*\(\s*'((?:[^']|'')*)'", stmt, re.S)
    if m is None:
        return "does not build its SQL with format('…', …)"
    specs = re.findall(r"%(?:\d+\$)?[-\d]*([a-zA-Z%])", m.group(1))
    bad = sorted({s for s in specs if s not in ("I", "L", "%")})
    if bad:
        return f"format() uses %{', %'.join(bad)} (only %I and %L quote)"
    outside = re.sub(r"'(?:[^']|'')*'", "''", stmt)
    if "||" in outside:
        return "concatenates with ||"
    return None


# The one file whose EXECUTEs run SQL that is not built from parts: run_sql_tasks runs an SQL
# task's request as it is, which is its job. It is a procedure run by the role that enqueued the
# task, in that role's own session (it claims only the session user's tasks and refuses SET ROLE),
# so the request gets that role's rights and nothing more (tests/py/test_sql_tasks.py proves it);
# its other EXECUTEs are constant strings.
RUNS_REQUESTS_AS_THEIR_ROLE = {"run_sql_tasks.sql"}
# distribute (Citus) runs the catalog's own text: skiplock's function definitions as
# pg_get_functiondef prints them, rewritten by constant replacements, and regprocedure names. It
# takes no argument and is granted to no role (the owner or a superuser runs it).
RUNS_CATALOG_TEXT = {"distribute.sql"}


def test_every_execute_quotes_its_input():
    found = 0
    problems = []
    for path in sorted(FUNCTIONS_DIR.glob("*.sql")):
        if path.name in RUNS_REQUESTS_AS_THEIR_ROLE | RUNS_CATALOG_TEXT:
            continue
        for stmt in execute_statements(strip_comments(path.read_text())):
            found += 1
            why = unsafe_execute(stmt)
            if why:
                problems.append(f"{path.name}: {why}: {' '.join(stmt.split())[:160]}")
    assert not problems, "\n".join(problems)
    print(f"\n{found} EXECUTE statements, all format() with %I/%L")


@pytest.mark.parametrize("stmt, why", [
    ("EXECUTE 'DROP TABLE queue.' || v_name;", "does not build"),
    ("EXECUTE format('DROP TABLE queue.%s', v_name);", "%s"),
    ("EXECUTE pg_catalog.format('DROP TABLE %I', v_name) || ' CASCADE';", "||"),
    ("EXECUTE v_sql;", "does not build"),
])
def test_the_execute_check_catches_unsafe_sql(stmt: str, why: str):
    stmts = execute_statements(stmt)
    assert len(stmts) == 1
    assert why in (unsafe_execute(stmts[0]) or "")


def test_the_execute_check_accepts_quoted_sql():
    stmt = "EXECUTE pg_catalog.format('ALTER TABLE %I.%I ATTACH PARTITION x FOR VALUES FROM (%L) TO (%L)', a, b, c, d);"
    assert unsafe_execute(execute_statements(stmt)[0]) is None
    assert execute_statements("GRANT EXECUTE ON FUNCTION queue.f() TO x;") == []
