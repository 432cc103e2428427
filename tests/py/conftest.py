"""Fixtures: one throwaway cluster per test session, a fresh database per test module.

Migrations run once per session, into a template database (`make test` builds it and names it
in SKIPLOCK_TEST_TEMPLATE); a module's database is a copy of it (CREATE DATABASE ... TEMPLATE),
the same catalog as `alembic upgrade head` in a fraction of the time. What migrations themselves
must prove is proven on databases they build: test_migrations, test_upgrade_under_load, test_embedding.

The cluster is the one `make test` started (SKIPLOCK_TEST_ADMIN_URL), else TEST_DATABASE_URL
(a server the tests may create databases on), else one this session starts itself. DATABASE_URL
is never read: tests drop and rebuild schema queue.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from typing import Iterator

import psycopg
import pytest

from dev import testrun
from dev.testrun import create_database, drop_database
from skiplock import devdb


@pytest.fixture(scope="session")
def cluster() -> Iterator[devdb.Cluster | None]:
    """The throwaway cluster this session started, or None when the server came from outside.

    Under pytest-xdist (`make test` runs three processes) each worker starts a cluster of its own even when `make test`
    started one: modules that hold the xmin horizon, cancel autovacuum or terminate backends must
    not reach into another worker's modules (TEST_DATABASE_URL, a server given on purpose, is
    shared all the same)."""
    xdist_worker = os.environ.get("PYTEST_XDIST_WORKER")
    if os.environ.get("TEST_DATABASE_URL") or (os.environ.get("SKIPLOCK_TEST_ADMIN_URL") and not xdist_worker):
        yield None
        return
    c = devdb.Cluster(durable=False).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def admin_url(cluster: devdb.Cluster | None) -> str:
    """A superuser URL on the test server, for creating databases."""
    if cluster is not None:
        return cluster.url()
    return os.environ.get("SKIPLOCK_TEST_ADMIN_URL") or os.environ["TEST_DATABASE_URL"]


@pytest.fixture(scope="session")
def template_db(admin_url: str) -> Iterator[str]:
    """The name of a database built by `alembic upgrade head`, closed to connections: copy it
    with create_database(admin_url, prefix, template=template_db)."""
    given = os.environ.get(testrun.TEMPLATE_ENV)
    if given and admin_url == os.environ.get("SKIPLOCK_TEST_ADMIN_URL"):
        yield given  # built by `make test` on its server, which drops it
        return
    name = testrun.prepare_template(admin_url)
    try:
        yield name
    finally:
        testrun.drop_template(admin_url, name)


def module_prefix(request: pytest.FixtureRequest) -> str:
    return re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])[:40]


@pytest.fixture(scope="module")
def empty_db(admin_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty database for this module."""
    url = create_database(admin_url, module_prefix(request))
    try:
        yield url
    finally:
        drop_database(admin_url, url)


@pytest.fixture(scope="module")
def db(admin_url: str, template_db: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database as `alembic upgrade head` builds it (what we ship): a copy of the template."""
    url = create_database(admin_url, module_prefix(request), template=template_db)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as c:
        yield c


@pytest.fixture(scope="module")
def restart_cluster() -> Iterator[devdb.Cluster]:
    """A cluster of the module's own, which its restart tests stop and start."""
    cluster = devdb.Cluster(durable=False).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def silent_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A TCP server on 127.0.0.1 that accepts each connection and never says a word (a proxy in
    front of a dead server, or a host that drops packets, looks the same to a client): its port,
    and the connections it holds (one an attempt)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], held
    finally:
        listener.close()
        for s in held:
            s.close()
