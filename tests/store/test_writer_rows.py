"""The job store's writer: rows gathered by kind across a transaction and written as
multi-row statements leave the same tables as one statement per row in the order given,
whatever the run lengths, repeats, interleavings and statements in between."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from prorl_async.config import ServerConfig
from prorl_async.core.handler import AgentHandler
from prorl_async.core.job import Job
from prorl_async.core.shared import Shared
from prorl_async.store import _commit, _resultlog
from prorl_async.store import sqlite as store_sqlite
from prorl_async.store._commit import RowKind
from prorl_async.store._writer import StoreWriteError, Writer
from prorl_async.store.sqlite import SqliteJobStore
from tests.helpers import eventually, eventually_sync

Row = tuple[Any, ...]


def _create(path: Path) -> Path:
    """A job database as the store opens it, with its schema."""
    conn = _commit.connect(path)
    conn.executescript(store_sqlite._SCHEMA)
    _resultlog.migrate(conn)
    conn.close()
    return path


def _schedule(seed: int) -> list[list[tuple[str, Row]]]:
    """Batches of accepts, finishes and expiries, in runs of 1..300 rows or interleaved
    row by row: an id finished twice in one batch now and then, finishes of ids never
    accepted (an UPDATE of nothing), ids accepted again after they finished or expired
    (the same id later in a batch, under a kind written earlier), expiries of unfinished
    ids (which must keep them), and other statements (tombstones, deletes) in between."""
    rng = random.Random(seed)
    batches: list[list[tuple[str, Row]]] = []
    accepted: list[str] = []
    n = 0

    def accept() -> tuple[str, Row]:
        nonlocal n
        if accepted and rng.random() < 0.05:
            job_id = rng.choice(accepted)  # again: INSERT OR REPLACE resets it
        else:
            job_id = f"j{n}"
            n += 1
            accepted.append(job_id)
        return store_sqlite._ACCEPT, (job_id, b"req", rng.randint(0, 2), "t")

    def finish() -> tuple[str, Row]:
        nonlocal n
        job_id = rng.choice(accepted) if rng.random() < 0.95 else "never"
        seq = n
        n += 1
        body = rng.randbytes(rng.randint(0, 64))
        status = rng.choice(("done", "failed", "cancelled"))
        reward = rng.choice((None, 0.0, 1.0))
        return store_sqlite._FINISH, (status, body, 100.0 + seq, seq, reward, job_id)

    def expire() -> tuple[str, Row]:
        return store_sqlite._EXPIRE, (rng.choice(accepted),)

    def other() -> tuple[str, Row]:
        if rng.random() < 0.5:
            return store_sqlite._TOMBSTONE, (rng.choice(accepted), 1.0)
        return store_sqlite._DELETE, (rng.choice(accepted),)

    for _ in range(16):
        batch: list[tuple[str, Row]] = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.35 or not accepted:
                batch += [accept() for _ in range(rng.choice((1, 3, 4, 17, 64, 65, 256, 300)))]
            elif r < 0.6:
                batch += [finish() for _ in range(rng.choice((1, 2, 16, 63, 257)))]
            elif r < 0.7:
                batch += [expire() for _ in range(rng.choice((1, 5, 40)))]
            elif r < 0.75:
                batch.append(other())
            else:  # the kinds interleaved, row by row
                make = (accept, accept, finish, finish, expire, other)
                batch += [rng.choice(make)() for _ in range(rng.randint(10, 400))]
        batches.append(batch)
    return batches


def _tables(path: Path) -> tuple[list[Row], list[Row]]:
    reader = sqlite3.connect(path)
    try:
        jobs = reader.execute("SELECT * FROM jobs ORDER BY id").fetchall()
        tombs = reader.execute("SELECT * FROM tombstones ORDER BY id").fetchall()
        return jobs, tombs
    finally:
        reader.close()


def _grouped(batch: list[tuple[str, Row]], rng: random.Random) -> list[tuple[str, list[Row]]]:
    """The batch's statements with runs of one statement cut at random into entries of
    many rows (``Writer.write_rows``): runs of 1 stay single rows."""
    out: list[tuple[str, list[Row]]] = []
    for sql, params in batch:
        if out and out[-1][0] == sql and rng.random() < 0.9:
            out[-1][1].append(params)
        else:
            out.append((sql, [params]))
    return out


async def _write(
    path: Path,
    kinds: tuple[RowKind, ...],
    batches: list[list[tuple[str, Row]]],
    group: random.Random | None = None,
) -> tuple[list[Row], list[Row]]:
    writer = Writer(_create(path), asyncio.get_running_loop(), kinds)
    try:
        for batch in batches:
            if group is None:
                for sql, params in batch:
                    writer.write(sql, params)
            else:
                for sql, rows in _grouped(batch, group):
                    if len(rows) == 1:
                        writer.write(sql, rows[0])
                    else:
                        writer.write_rows(sql, rows)
            await writer.sync()
    finally:
        await writer.aclose()
    return _tables(path)


@pytest.mark.parametrize("seed", range(8))
async def test_multi_row_statements_write_what_one_row_statements_write(
    tmp_path: Path, seed: int
) -> None:
    if store_sqlite._ROWS[1].many(4) is None:
        pytest.skip(f"SQLite {sqlite3.sqlite_version} has no UPDATE ... FROM: one row at a time")
    batches = _schedule(seed)
    one_row = await _write(tmp_path / "one.sqlite3", (), batches)
    multi = await _write(tmp_path / "multi.sqlite3", store_sqlite._ROWS, batches)
    jobs, tombs = one_row
    assert len(jobs) > 100 and tombs
    assert any(row[2] != "accepted" for row in jobs)
    assert any(row[2] == "accepted" for row in jobs)
    assert multi == one_row
    # Rows handed over many to an entry (as expiry does): the same tables, by kind or not.
    rng = random.Random(seed)
    assert await _write(tmp_path / "rows.sqlite3", store_sqlite._ROWS, batches, rng) == one_row
    assert await _write(tmp_path / "rows1.sqlite3", (), batches, rng) == one_row


async def test_without_a_multi_row_form_a_run_is_written_row_by_row(tmp_path: Path) -> None:
    """What an old system SQLite gets (``many`` None): the same table."""
    kinds = (
        RowKind(store_sqlite._ACCEPT, 0),
        RowKind(store_sqlite._FINISH, 5),
        store_sqlite._ROWS[2],  # DELETE ... IN needs nothing new
    )
    batches = _schedule(7)
    one_row = await _write(tmp_path / "one.sqlite3", (), batches)
    assert await _write(tmp_path / "old.sqlite3", kinds, batches) == one_row


async def test_an_error_that_is_not_sqlites_fails_the_batch_and_the_next_one_commits(
    tmp_path: Path,
) -> None:
    """Whatever goes wrong in a commit, every waiter is answered (no hang) and the writer
    lives on."""
    broken = RowKind(store_sqlite._ACCEPT, key=9)  # no parameter 9: IndexError
    writer = Writer(_create(tmp_path / "jobs.sqlite3"), asyncio.get_running_loop(), (broken,))
    try:
        writer.write(store_sqlite._ACCEPT, ("j1", b"req", 0, "t"))
        with pytest.raises(StoreWriteError, match="IndexError"):
            await writer.sync()
        writer.write(store_sqlite._TOMBSTONE, ("j1", 1.0))
        await writer.sync()
    finally:
        await writer.aclose()
    jobs, tombs = _tables(tmp_path / "jobs.sqlite3")
    assert jobs == [] and tombs == [("j1", 1.0)]


async def test_a_killed_writer_fails_every_waiter_and_every_later_write(tmp_path: Path) -> None:
    writer = Writer(_create(tmp_path / "jobs.sqlite3"), asyncio.get_running_loop())
    try:
        writer.write(store_sqlite._TOMBSTONE, ("j0", 1.0))
        await writer.sync()
        os.kill(writer.pid, signal.SIGKILL)
        # a batch sent to a dead process, or refused at the pipe: either way an error
        writer.write(store_sqlite._TOMBSTONE, ("j1", 1.0))
        with pytest.raises(StoreWriteError, match=f"process {writer.pid}"):
            await writer.sync()
        with pytest.raises(StoreWriteError):
            writer.write(store_sqlite._TOMBSTONE, ("j2", 1.0))
    finally:
        await writer.aclose()
    _, tombs = _tables(tmp_path / "jobs.sqlite3")
    assert tombs == [("j0", 1.0)]


@pytest.mark.skipif(sys.platform != "linux", reason="F_SETPIPE_SZ is Linux's")
async def test_a_batch_of_hundreds_of_jobs_goes_into_the_pipe_at_once(tmp_path: Path) -> None:
    """A 500-job batch (~200 KB) is in the writer's pipe the moment it is handed over,
    even while the writer is busy (stopped here): in a 64 KiB pipe its tail waited in the
    loop for the next poll for writability, an iteration of a busy loop later."""
    writer = Writer(_create(tmp_path / "jobs.sqlite3"), asyncio.get_running_loop())
    try:
        os.kill(writer.pid, signal.SIGSTOP)
        for i in range(500):
            writer.write(store_sqlite._ACCEPT, (f"j{i}", os.urandom(400), 0, "t"))
        writer.cut(1)
        assert writer._handed is not None and not writer._out  # all of it in the pipe
        os.kill(writer.pid, signal.SIGCONT)
        async with asyncio.timeout(30):
            await writer.sync()
    finally:
        os.kill(writer.pid, signal.SIGCONT)
        await writer.aclose()
    jobs, _ = _tables(tmp_path / "jobs.sqlite3")
    assert len(jobs) == 500


async def test_close_commits_what_is_queued_and_reaps_the_writer(tmp_path: Path) -> None:
    writer = Writer(_create(tmp_path / "jobs.sqlite3"), asyncio.get_running_loop())
    body = os.urandom(1 << 20)  # more than a pipe holds: sent as the writer reads
    for i in range(8):
        writer.write(store_sqlite._ACCEPT, (f"j{i}", body, 0, "t"))
    await writer.aclose()
    assert writer._proc.returncode == 0
    jobs, _ = _tables(tmp_path / "jobs.sqlite3")
    assert [row[0] for row in jobs] == [f"j{i}" for i in range(8)]
    assert all(row[1] == body for row in jobs)
    with pytest.raises(RuntimeError, match="closed"):
        writer.write(store_sqlite._TOMBSTONE, ("j9", 1.0))


def test_the_writer_commits_what_arrived_whole_when_its_input_ends(tmp_path: Path) -> None:
    """The server killed mid-send: the batches that arrived whole are committed, a torn
    last one is not, and the writer exits."""
    path = _create(tmp_path / "jobs.sqlite3")
    script = Path(_commit.__file__)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(script), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None
    whole = _commit.frame((1, [(store_sqlite._TOMBSTONE, ("j1", 1.0))], []))
    torn = _commit.frame((2, [(store_sqlite._TOMBSTONE, ("j2", 1.0))], []))
    out, _ = proc.communicate(_commit.frame([]) + whole + torn[:-3], timeout=60)
    assert proc.returncode == 0
    assert list(_commit.frames(bytearray(out))) == [(1, None)]
    _, tombs = _tables(path)
    assert tombs == [("j1", 1.0)]


async def test_a_writer_that_cannot_open_its_file_says_why(tmp_path: Path) -> None:
    writer = Writer(tmp_path, asyncio.get_running_loop())  # a directory, not a database
    try:
        writer.write(store_sqlite._TOMBSTONE, ("j1", 1.0))
        with pytest.raises(StoreWriteError, match="unable to open database file"):
            await writer.sync()
    finally:
        await writer.aclose()
    assert writer._proc.returncode == 1


async def test_the_wal_is_checkpointed_while_the_writer_runs(tmp_path: Path) -> None:
    """Commits never checkpoint (the writer's connection has no automatic checkpoint);
    a thread of the writer does, once enough rows changed: the database file itself
    grows while the writer is open, not only when it closes."""
    path = _create(tmp_path / "jobs.sqlite3")
    empty = path.stat().st_size
    writer = Writer(path, asyncio.get_running_loop(), store_sqlite._ROWS)
    try:
        request = os.urandom(400)
        for i in range(2 * _commit._CHECKPOINT_ROWS):
            writer.write(store_sqlite._ACCEPT, (f"j{i:05}", request, 0, "t"))
            if i % 500 == 499:
                await writer.sync()
        await writer.sync()
        rows = 2 * _commit._CHECKPOINT_ROWS * len(request)
        await eventually(lambda: path.stat().st_size >= empty + rows // 2, timeout=60)
    finally:
        await writer.aclose()
    jobs, _ = _tables(path)
    assert len(jobs) == 2 * _commit._CHECKPOINT_ROWS


def test_a_wal_past_the_cap_is_checkpointed_by_the_writer_itself(tmp_path: Path) -> None:
    """Commits that never paused for the thread's checkpoint to empty the WAL: the next
    due checkpoint runs at once on the writer's own connection."""
    path = _create(tmp_path / "jobs.sqlite3")
    conn = _commit.connect(path)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    checkpointer = _commit._Checkpointer(str(path))
    try:
        checkpointer.wal_pages = _commit._WAL_CAP_PAGES  # what the thread last found
        empty = path.stat().st_size
        request = os.urandom(400)
        with conn:
            conn.executemany(
                store_sqlite._ACCEPT,
                [(f"j{i:05}", request, 0, "t") for i in range(_commit._CHECKPOINT_ROWS)],
            )
        checkpointer.committed(conn)
        # Done before committed() returned: the rows are in the database file itself.
        assert path.stat().st_size >= empty + _commit._CHECKPOINT_ROWS * len(request) // 2
        assert checkpointer.wal_pages < _commit._WAL_CAP_PAGES
    finally:
        checkpointer.close()
        conn.close()


class _NotRun(AgentHandler):
    name = "sleep"

    async def run(self, job: Job) -> None:
        raise AssertionError("the store runs no job")


def _ended(i: int, callback: bool) -> Job:
    job = Job(
        job_id=f"w{i:03}",
        task="sleep",
        handler=_NotRun(),  # the store reads none of the job's running parts
        instance={},
        sampling_params={},
        timeout_s=60.0,
        metadata={},
        shared=Shared(ServerConfig()),
    )
    job.callback_url = "http://127.0.0.1:9/hook" if callback else None
    return job


async def test_a_wave_of_results_goes_to_the_writer_in_chunks_a_job_whole(
    tmp_path: Path,
) -> None:
    """Jobs that end in one loop step: their rows reach the writer in chunks while the step
    goes on (it commits the first ones before the step ends), every chunk ends at a job's
    last row (a result and its callback's outbox row commit together), and what follows the
    last cut goes at the end of the step."""
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path=path, retention_s=600, tombstone_s=600, cache_bytes=1 << 20)
    store.open()
    reader = sqlite3.connect(path)
    try:
        jobs = [_ended(i, callback=i % 2 == 0) for i in range(150)]
        for job in jobs:
            store.add(job)
        await store.sync()
        # Where the store must cut: after the job whose rows fill the batch to the chunk.
        cuts, rows = [], 0
        for n, job in enumerate(jobs, 1):
            rows += 2 if job.callback_url else 1
            if rows >= store_sqlite._FINISH_CHUNK:
                cuts.append(n)
                rows = 0
        assert len(cuts) >= 2
        # One loop step from here to the end of the reads: no await.
        for i, job in enumerate(jobs):
            job.status, job.result, job.seq = "done", b'{"i": %d}' % i, i + 1
            store.finished(job)

        def committed() -> tuple[list[str], list[str]]:
            done = reader.execute("SELECT id FROM jobs WHERE status = 'done' ORDER BY id")
            hooks = reader.execute("SELECT job_id FROM outbox ORDER BY job_id")
            return [r[0] for r in done], [r[0] for r in hooks]

        # a synchronous poll: this loop step must not yield
        eventually_sync(
            lambda: len(committed()[0]) >= cuts[-1],
            60,
            lambda: f"the writer to commit {cuts[-1]} rows; done {len(committed()[0])}",
            interval=0.01,
        )
        done, hooks = committed()
        handed = jobs[: cuts[-1]]
        assert done == [job.id for job in handed]  # the chunks, and nothing after them
        assert hooks == [job.id for job in handed if job.callback_url]
        await store.sync()  # the end of the step hands over the rest
        done, hooks = committed()
        assert done == [job.id for job in jobs]
        assert hooks == [job.id for job in jobs if job.callback_url]
    finally:
        reader.close()
        await store.aclose()


async def test_a_result_dropped_from_memory_before_its_commit_is_read_after_it(
    tmp_path: Path,
) -> None:
    """Results past the memory bound drop oldest first, even before their commit: a read of
    them waits for that commit and then finds them in the file (never reported missing,
    never served uncommitted). The writer is stopped while they end."""
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path=path, retention_s=600, tombstone_s=600, cache_bytes=100)
    store.open()
    try:
        jobs = [_ended(i, callback=False) for i in range(3)]
        for job in jobs:
            store.add(job)
        await store.sync()
        writer = store._writer
        assert writer is not None
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            for i, job in enumerate(jobs):  # ~55 bytes each: the first two drop from memory
                job.status, job.result, job.seq = (
                    "done",
                    b'{"i": %d, "pad": "%s"}'
                    % (
                        i,
                        b"x" * 40,
                    ),
                    i + 1,
                )
                store.finished(job)
            assert store.stats().cache_bytes == len(jobs[2].result or b"")
            read = asyncio.create_task(store.results([job.id for job in jobs]))
            # Nothing can commit while the writer is stopped: no answer in this second.
            answered, _ = await asyncio.wait({read}, timeout=1.0)
            assert not answered, read.result()
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        got = await asyncio.wait_for(read, 30)
        assert got == {job.id: job.result for job in jobs}
    finally:
        await store.aclose()


async def test_a_partial_read_answers_committed_results_now_and_waits_only_if_none_is(
    tmp_path: Path,
) -> None:
    """``results(partial=True)`` (what /poll asks): results already committed come back at
    once and those still in the write queue are left out (the poll lists them as pending);
    with none committed it waits for the commit, as a full read always does. The writer is
    stopped while the second group ends."""
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path=path, retention_s=600, tombstone_s=600, cache_bytes=1 << 20)
    store.open()
    try:
        jobs = [_ended(i, callback=False) for i in range(5)]
        for job in jobs:
            store.add(job)
        for i, job in enumerate(jobs):
            job.status, job.result, job.seq = "done", b'{"i": %d}' % i, i + 1
        for job in jobs[:3]:
            store.finished(job)
        await store.sync()
        writer = store._writer
        assert writer is not None
        os.kill(writer.pid, signal.SIGSTOP)
        try:
            for job in jobs[3:]:
                store.finished(job)
            ids = [job.id for job in jobs]
            got = await asyncio.wait_for(store.results(ids, partial=True), 30)
            assert got == {job.id: job.result for job in jobs[:3]}
            late = [job.id for job in jobs[3:]]
            reads = {
                asyncio.create_task(store.results(late, partial=True)),
                asyncio.create_task(store.results(ids)),
            }
            # Nothing can commit while the writer is stopped: neither answers in this second.
            answered, _ = await asyncio.wait(reads, timeout=1.0)
            assert not answered, [read.result() for read in answered]
        finally:
            os.kill(writer.pid, signal.SIGCONT)
        done, _ = await asyncio.wait(reads, timeout=30)
        assert len(done) == 2
        answers = sorted((read.result() for read in done), key=len)
        assert answers == [{j.id: j.result for j in jobs[3:]}, {j.id: j.result for j in jobs}]
    finally:
        await store.aclose()


async def test_the_memory_bound_drops_oldest_first_and_expiry_leaves_no_index_behind(
    tmp_path: Path,
) -> None:
    """The cached documents are dropped oldest first once over the bound; and once every
    result has expired, nothing of them is left in memory (the index of cached documents
    included): the store's memory does not grow with the jobs it has seen."""
    path = tmp_path / "jobs.sqlite3"
    store = SqliteJobStore(path=path, retention_s=600, tombstone_s=600, cache_bytes=300)
    store.open()
    try:
        jobs = [_ended(i, callback=False) for i in range(20)]
        for job in jobs:
            store.add(job)
        for i, job in enumerate(jobs):  # 50 bytes each: six fit in the bound
            job.status, job.result, job.seq = "done", b"%050d" % i, i + 1
            store.finished(job)
        await store.sync()
        kept = {j for j, rec in store._done.items() if rec[4] is not None}
        assert kept == {job.id for job in jobs[-6:]}
        assert store.stats().cache_bytes == 300
        got = await store.results([job.id for job in jobs])  # the rest from the file
        assert got == {job.id: job.result for job in jobs}
        assert store.expire(time.monotonic() + 601) == len(jobs)
        assert (len(store._done), len(store._expiry), len(store._cached)) == (0, 0, 0)
        assert store.stats().cache_bytes == 0
    finally:
        await store.aclose()
