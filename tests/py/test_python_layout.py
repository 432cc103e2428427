"""The package's shape: the modules of skiplock/ import each other without a circle, at the top;
each of them is reached by a user command, and none imports the harness (dev/), which the wheel
does not carry (tests/py/test_migrations.py builds the wheel and checks what it holds).

No database: the imports are read from the source with ast.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from skiplock.sqlfiles import ROOT

PACKAGE = ROOT / "skiplock"


def modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(PACKAGE.glob("*.py"))}


def skiplock_imports(node: ast.AST, known: set[str]) -> set[str]:
    """The skiplock modules that the import statements under node name."""
    found: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Import):
            for alias in n.names:
                parts = alias.name.split(".")
                if parts[0] == "skiplock" and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            parts = n.module.split(".")
            if parts[0] != "skiplock":
                continue
            if len(parts) > 1:
                found.add(parts[1])
            else:  # from skiplock import x: a module when skiplock/x.py exists
                found.update(alias.name for alias in n.names if alias.name in known)
        elif isinstance(n, ast.ImportFrom) and n.level > 0:
            raise AssertionError(f"relative import at line {n.lineno}: write `from skiplock…`")
    return found


def import_graph() -> dict[str, set[str]]:
    known = set(modules())
    return {name: skiplock_imports(ast.parse(path.read_text()), known) - {name}
            for name, path in modules().items()}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, as a path that ends where it starts, or None."""
    state: dict[str, str] = {}   # "open" while on the current path, "done" once explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_circle_and_passes_a_dag() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_skiplock_modules_import_each_other_without_a_circle() -> None:
    graph = import_graph()
    assert {"cli", "errors", "slots", "cmd_worker", "cmd_run_sql"} <= set(graph)
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


def test_skiplock_modules_are_imported_at_the_top_of_a_module() -> None:
    """An import of a skiplock module inside a function is how a circle hides: none is allowed."""
    known = set(modules())
    hidden = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for inner in skiplock_imports(node, known):
                    hidden.append(f"{name}.{node.name} imports skiplock.{inner}")
    assert hidden == []


def test_the_commands_report_errors_through_skiplock_errors() -> None:
    graph = import_graph()
    assert "cli" not in set().union(*(deps for name, deps in graph.items() if name != "__main__"))
    for command in ("cmd_enqueue", "cmd_maintain", "cmd_run_sql", "cmd_worker"):
        assert "errors" in graph[command], command
    assert {"slots"} <= graph["cmd_run_sql"] and {"worker"} <= graph["cmd_worker"]
    assert "cmd_worker" not in graph["cmd_run_sql"]


# A worker's calls: taking, ending, heartbeating a task, and the workers' maintenance.
WORKER_CALL = re.compile(r"queue\.(take_next|take_locked|finish|finish_locked|fail|fail_locked|heartbeat|release"
                         r"|maintain_now)\((?:\)|%s|[a-z_]+ =>)")


def worker_calls(path: Path) -> list[str]:
    """The SQL statements in path's string literals that call a worker function."""
    return [n.value for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and "SELECT" in n.value
            and WORKER_CALL.search(n.value)]


def test_one_worker_loop_in_the_codebase() -> None:
    """Issue 52: `skiplock worker` (the CLI) and the reference client are thin layers over
    skiplock.worker: no other module of the package, nor the client script, takes, heartbeats or
    ends a task itself (the CLI's loop of slots once did, in cmd_worker.py and slots.py). In
    skiplock/worker.py each statement is written once, as a module constant, and exactly two
    drivers take tasks with them: Worker (threads) and AsyncWorker (asyncio, in coroutines)."""
    found = {path.stem: worker_calls(path) for path in modules().values()}
    assert found["worker"], "the pattern finds the library's own calls"
    assert {name for name, calls in found.items() if calls} == {"worker"}, found
    assert worker_calls(ROOT / "clients" / "python" / "worker.py") == []
    tree = ast.parse((PACKAGE / "worker.py").read_text())
    statements = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  and "SELECT" in n.value.value and WORKER_CALL.search(n.value.value)}
    assert len(statements) == len(found["worker"]) == len(set(found["worker"])), \
        "a worker's statement written outside the module's constants, or twice"
    takes = {name for name in statements if name.startswith("TAKE")}
    assert {"TAKE_ONE", "TAKE_SEVERAL", "TAKE_LOCKED_ONE", "TAKE_LOCKED_SEVERAL"} <= takes, statements
    drivers: dict[str, set[type]] = {}
    for top in tree.body:
        for fn in ast.walk(top):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(n, ast.Name) and n.id in takes for n in ast.walk(fn)):
                drivers.setdefault(getattr(top, "name", "?"), set()).add(type(fn))
    assert drivers == {"Worker": {ast.FunctionDef}, "AsyncWorker": {ast.AsyncFunctionDef}}, drivers


# What a user runs: the `skiplock` command (cli, through __main__ or the console script) and the package itself.
ENTRY_POINTS = {"__init__", "__main__", "cli"}


def test_every_module_of_the_package_is_reached_by_a_user_command() -> None:
    """A module no command imports is harness or dead code: it belongs in dev/, not in the wheel."""
    graph = import_graph()
    reached, todo = set(), list(ENTRY_POINTS)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph.get(name, ()))
    assert set(graph) - reached == set(), "not reached from the skiplock command: move to dev/"


def test_the_package_imports_nothing_from_the_harness() -> None:
    """An installed skiplock has no dev/: a module of the package that imported it would fail there."""
    found = []
    for name, path in modules().items():
        for n in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else \
                [n.module] if isinstance(n, ast.ImportFrom) and n.module else []
            found += [f"{name} imports {m}" for m in names if m.split(".")[0] == "dev"]
    assert found == []
    assert not (PACKAGE / "testrun.py").exists() and (ROOT / "dev" / "testrun.py").exists()


def test_the_package_says_the_version_pyproject_gives():
    """`skiplock --version` and the wheel's metadata say the same release (make release writes both)."""
    import skiplock
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]*)"$', pyproject, re.M)
    assert declared and declared.group(1) == skiplock.__version__
