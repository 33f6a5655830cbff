"""The result log and tenants in the job database: schema additions, and loading.

``jobs`` gains ``tenant``, ``seq`` and ``reward`` (added to an older database in
place); ``meta`` keeps the last seq handed out and committed (so numbering never goes
back, even when the newest rows are deleted) and the log's epoch; ``floors`` keeps,
per tenant, the highest seq retention has dropped (a cursor below it answers 410).
"""

from __future__ import annotations

import sqlite3
import sys
import uuid

from prorl_async.core.resultlog import ResultLog

__all__ = ["FLOOR", "LAST_SEQ", "expire_at_open", "load_log", "migrate"]

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS floors (tenant TEXT PRIMARY KEY, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_seq ON jobs(seq) WHERE seq IS NOT NULL;
"""
_COLUMNS = {
    "tenant": "ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default'",
    "seq": "ALTER TABLE jobs ADD COLUMN seq INTEGER",
    "reward": "ALTER TABLE jobs ADD COLUMN reward REAL",
}
LAST_SEQ = (
    "INSERT INTO meta(key, value) VALUES ('last_seq', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"
)
FLOOR = (
    "INSERT INTO floors(tenant, seq) VALUES (?, ?) "
    "ON CONFLICT(tenant) DO UPDATE SET seq = max(seq, excluded.seq)"
)

_FLOORS_AT_OPEN = (
    "INSERT INTO floors(tenant, seq) "
    "SELECT tenant, max(seq) FROM jobs WHERE expires_at <= ? AND seq IS NOT NULL "
    "GROUP BY tenant ON CONFLICT(tenant) DO UPDATE SET seq = max(seq, excluded.seq)"
)


def migrate(conn: sqlite3.Connection) -> None:
    """Add what this version keeps to a database of any earlier one (idempotent)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(jobs)")}
    with conn:
        for name, sql in _COLUMNS.items():
            if name not in have:
                conn.execute(sql)
        conn.executescript(_TABLES)


def expire_at_open(conn: sqlite3.Connection, now: float) -> None:
    """Before rows past retention are deleted at open: raise their tenants' floors, and
    drop their settled callback deliveries (a pending one fails when it finds no result)."""
    conn.execute(_FLOORS_AT_OPEN, (now,))
    conn.execute(
        "DELETE FROM outbox WHERE state != 'pending' "
        "AND job_id IN (SELECT id FROM jobs WHERE expires_at <= ?)",
        (now,),
    )


def load_log(conn: sqlite3.Connection, log: ResultLog) -> None:
    """Fill ``log`` from the file: its numbering, floors and every committed entry."""
    meta = dict(conn.execute("SELECT key, value FROM meta"))
    epoch = meta.get("epoch")
    if epoch is None:
        epoch = uuid.uuid4().hex[:16]
        with conn:
            conn.execute("INSERT INTO meta(key, value) VALUES ('epoch', ?)", (epoch,))
    log.restore(last_seq=int(meta.get("last_seq") or 0), epoch=str(epoch))
    for tenant, seq in conn.execute("SELECT tenant, seq FROM floors"):
        log.expire(sys.intern(tenant), seq)
    rows = conn.execute(
        "SELECT tenant, seq, id, status, reward FROM jobs WHERE seq IS NOT NULL ORDER BY seq"
    )
    for tenant, seq, job_id, status, reward in rows:
        log.load(sys.intern(tenant), seq, job_id, sys.intern(status), reward)
