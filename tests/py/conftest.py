"""Fixtures: one throwaway cluster per test session, a fresh database per test module.

The cluster is the one `make test` started (SKIPLOCK_TEST_ADMIN_URL), else TEST_DATABASE_URL
(a server the tests may create databases on), else one this session starts itself. DATABASE_URL
is never read: tests drop and rebuild schema queue.
"""

from __future__ import annotations

import os
import re
from typing import Iterator

import psycopg
import pytest

from skiplock import devdb, migrate
from skiplock.testrun import create_database, drop_database


@pytest.fixture(scope="session")
def cluster() -> Iterator[devdb.Cluster | None]:
    """The throwaway cluster this session started, or None when the server came from outside."""
    if os.environ.get("SKIPLOCK_TEST_ADMIN_URL") or os.environ.get("TEST_DATABASE_URL"):
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


@pytest.fixture(scope="module")
def empty_db(admin_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new, empty database for this module."""
    prefix = re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1])[:40]
    url = create_database(admin_url, prefix)
    try:
        yield url
    finally:
        drop_database(admin_url, url)


@pytest.fixture(scope="module")
def db(empty_db: str) -> str:
    """A database built by `alembic upgrade head`: what we ship."""
    migrate.upgrade(empty_db)
    return empty_db


@pytest.fixture
def conn(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as c:
        yield c
