"""The job store's writer: runs of rows written as multi-row statements leave the same
table as one statement per row, whatever the run lengths, repeats and interleavings."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from prorl_async.store import _completions
from prorl_async.store import sqlite as store_sqlite
from prorl_async.store._writer import RowKind, Writer

Row = tuple[Any, ...]


def _connect(path: Path) -> sqlite3.Connection:
    """A write connection as the store opens it, on its schema."""
    conn = store_sqlite._connect(path)
    conn.executescript(store_sqlite._SCHEMA)
    _completions.migrate(conn)
    return conn


def _schedule(seed: int) -> list[list[tuple[str, Row]]]:
    """Batches of accepts and finishes: runs of 1..300 rows, an id finished twice in one
    batch now and then, finishes of ids never accepted (an UPDATE of nothing)."""
    rng = random.Random(seed)
    batches: list[list[tuple[str, Row]]] = []
    accepted: list[str] = []
    n = 0
    for _ in range(12):
        batch: list[tuple[str, Row]] = []
        for _ in range(rng.randint(1, 6)):
            if rng.random() < 0.5 or not accepted:
                for _ in range(rng.choice((1, 3, 4, 17, 64, 65, 256, 300))):
                    job_id = f"j{n}"
                    n += 1
                    accepted.append(job_id)
                    batch.append((store_sqlite._ACCEPT, (job_id, b"req", 0, "t")))
            else:
                for _ in range(rng.choice((1, 2, 16, 63, 257))):
                    job_id = rng.choice(accepted) if rng.random() < 0.95 else "never"
                    seq = n
                    n += 1
                    body = rng.randbytes(rng.randint(0, 64))
                    status = rng.choice(("done", "failed", "cancelled"))
                    reward = rng.choice((None, 0.0, 1.0))
                    params = (status, body, 100.0 + seq, seq, reward, job_id)
                    batch.append((store_sqlite._FINISH, params))
        batches.append(batch)
    return batches


async def _write(
    path: Path, kinds: tuple[RowKind, ...], batches: list[list[tuple[str, Row]]]
) -> list[Row]:
    conn = _connect(path)
    writer = Writer(conn, asyncio.get_running_loop(), kinds)
    try:
        for batch in batches:
            for sql, params in batch:
                writer.write(sql, params)
            await writer.sync()
    finally:
        await writer.aclose()
    reader = sqlite3.connect(path)
    try:
        return reader.execute("SELECT * FROM jobs ORDER BY id").fetchall()
    finally:
        reader.close()


@pytest.mark.parametrize("seed", range(4))
async def test_multi_row_statements_write_what_one_row_statements_write(
    tmp_path: Path, seed: int
) -> None:
    if store_sqlite._ROWS[1].many(4) is None:
        pytest.skip(f"SQLite {sqlite3.sqlite_version} has no UPDATE ... FROM: one row at a time")
    batches = _schedule(seed)
    one_row = await _write(tmp_path / "one.sqlite3", (), batches)
    multi = await _write(tmp_path / "multi.sqlite3", store_sqlite._ROWS, batches)
    assert len(one_row) > 100
    assert any(row[2] != "accepted" for row in one_row)
    assert multi == one_row


async def test_without_a_multi_row_form_a_run_is_written_row_by_row(tmp_path: Path) -> None:
    """What an old system SQLite gets (``many`` None): the same table."""
    kinds = (RowKind(store_sqlite._ACCEPT, None, 0), RowKind(store_sqlite._FINISH, None, 5))
    batches = _schedule(7)
    one_row = await _write(tmp_path / "one.sqlite3", (), batches)
    assert await _write(tmp_path / "old.sqlite3", kinds, batches) == one_row
