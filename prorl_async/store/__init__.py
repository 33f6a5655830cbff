"""Job records behind one interface: in memory, or durable in SQLite (the default)."""

from prorl_async.core.jobstore import JobStore, StoreStats, UnfinishedRecord
from prorl_async.store.memory import MemoryJobStore
from prorl_async.store.sqlite import SqliteJobStore, StoreError
from prorl_async.store.statedir import StateDirBusy, StateDirLock, set_aside

__all__ = [
    "JobStore",
    "MemoryJobStore",
    "SqliteJobStore",
    "StateDirBusy",
    "StateDirLock",
    "StoreError",
    "StoreStats",
    "UnfinishedRecord",
    "set_aside",
]
