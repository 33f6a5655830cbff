"""Server configuration: one typed struct, loaded from TOML, ``PRORL_*`` env and flags.

Precedence, lowest to highest: built-in defaults, the TOML file, environment
variables (``PRORL_RUN_WORKERS=64``), command-line flags.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from prorl_async.capacity.autoscale import AutoscaleConfig
from prorl_async.llm.pool import PoolConfig
from prorl_async.notify.config import CallbacksConfig, EventsConfig, NotifyConfigError
from prorl_async.sandbox.limits import SandboxLimits
from prorl_async.sandbox.spec import RuntimeConfig, SpecError
from prorl_async.tenancy.config import TenantConfig, TenantsError, check_tenants, read_tokens_file

__all__ = ["ConfigError", "ServerConfig", "default_state_dir", "load_config"]


def default_state_dir() -> str:
    """A per-user cache directory: ``$XDG_CACHE_HOME/prorl-async`` or ``~/.cache/prorl-async``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "prorl-async")


class ServerConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Everything the server can be told. Field names double as TOML keys and flags."""

    host: str = "127.0.0.1"
    port: int = 8400
    # Once listening, the bound port is written here (atomically): for ``--port 0``.
    port_file: str | None = None
    # Bearer token; prefer PRORL_TOKEN or token_file to a flag (flags show in `ps`).
    token: str | None = None
    # A file holding the token (surrounding whitespace dropped); exclusive with token.
    token_file: str | None = None
    # TOML file (mode 600) of [tenants.NAME] tables: token, max_inflight, weight, admin.
    tokens_file: str | None = None
    # A file holding the token Prometheus scrapes /metrics with (its `authorization`
    # credentials_file). Where tokens are configured, /metrics answers only this token
    # or an admin's: the metrics name every tenant.
    metrics_token_file: str | None = None
    # The scrape token itself; prefer metrics_token_file. Exclusive with it.
    metrics_token: str | None = None
    # The tenants (from tokens_file, or [tenants.NAME] tables here); each its own token.
    tenants: dict[str, TenantConfig] = msgspec.field(default_factory=dict)
    # [callbacks]: allow_hosts, secret_file (or PRORL_CALLBACK_SECRET), retries.
    callbacks: CallbacksConfig = msgspec.field(default_factory=CallbacksConfig)
    # [events]: the GET /events stream's heartbeat and per-consumer buffer bound.
    events: EventsConfig = msgspec.field(default_factory=EventsConfig)
    state_dir: str = msgspec.field(default_factory=default_state_dir)
    init_workers: int = 8
    run_workers: int = 64
    eval_workers: int = 16
    # Unfinished jobs admitted at once; beyond this submit answers 503 + Retry-After.
    max_jobs: int = 100_000
    default_timeout_s: float = 3600.0
    # Longest a single long-poll may wait; a larger ?wait= is cut to this.
    max_wait_s: float = 300.0
    # Terminal results are kept this long, then dropped (bounded memory).
    retention_s: float = 3600.0
    # Ids of cancelled jobs are remembered this long so a late resubmit cannot resurrect them.
    tombstone_s: float = 86_400.0
    # Job store: sqlite (durable, <state_dir>/jobs.sqlite3) or memory (lost on exit).
    store: str = "sqlite"
    # Jobs a dead server accepted and never finished: requeue (run again) or fail them.
    on_restart: str = "requeue"
    # A commit the sqlite store's writer has not made in this many seconds makes submits
    # answer 503 + Retry-After (and /healthz 503) instead of waiting for it.
    commit_timeout_s: float = 30.0
    # Result documents kept in memory by the sqlite store (the rest is read from the file).
    result_cache_bytes: int = 64 * 1024 * 1024
    # Move an unreadable job database aside (renamed with a timestamp) instead of refusing.
    reset_state: bool = False
    max_body_bytes: int = 8 * 1024 * 1024
    # A request's header block, and its body, must arrive within this many seconds;
    # a connection that sends nothing is closed after it. A long-poll is not cut.
    read_timeout_s: float = 30.0
    # An idle keep-alive connection is closed after this many seconds.
    keepalive_s: float = 75.0
    # Open connections at once; beyond it a new one is answered 503 and closed. Lowered
    # at start to leave 512 descriptors free under the open-file limit (raised to its hard limit).
    max_connections: int = 10_000
    max_batch: int = 10_000
    # Seconds given to stage tasks to release their resources at stop.
    stop_grace_s: float = 30.0
    # LLM side (used by handlers that run the agent loop).
    tokenizer: str | None = None
    max_model_len: int = 32768
    max_tokens: int = 1024
    max_turns: int = 16
    # Sandbox runtime: auto (bwrap where it works, else local), bwrap, apptainer, local.
    runtime: str = "auto"
    # Apptainer image used when a task names none.
    image: str | None = None
    sandbox_limits: SandboxLimits = msgspec.field(default_factory=SandboxLimits)
    # The runtime's own settings: the [sandbox] table (hide_paths, extra_binds, allow_network,
    # sandbox_uid, cgroup_parent, run_dir, ...). Its state_dir is the server's.
    sandbox: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)
    pool: PoolConfig = msgspec.field(default_factory=PoolConfig)
    log_level: str = "info"
    # Live sandboxes of all stages together; None: physical memory / sandbox_limits.memory_bytes.
    max_sandboxes: int | None = None
    # Sandboxes of the instance-independent spec kept started ahead (within max_sandboxes).
    warm_sandboxes: int = 0
    # INIT starts a job only when RUN will take it soon (no sandbox idles in RUN's queue).
    jit_init: bool = True
    # When start_sandbox launches the sandbox: eager (in the call, as INIT runs) or
    # on_first_use (at the handler's or the model's first use; never, if nothing uses it).
    sandbox_start: str = "eager"
    # Let the autoscaler set every stage's workers (bounds and pace in ``autoscaling``).
    autoscale: bool = False
    autoscaling: AutoscaleConfig = msgspec.field(default_factory=AutoscaleConfig)


class ConfigError(ValueError):
    """A configuration value was wrong; the message names it."""


_ENV_PREFIX = "PRORL_"


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    fields = set(ServerConfig.__struct_fields__)
    out: dict[str, Any] = {}
    for key, value in env.items():
        if key.startswith(_ENV_PREFIX):
            name = key[len(_ENV_PREFIX) :].lower()
            if name in fields:
                out[name] = value
    return out


def load_config(
    *,
    path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Build the config from a TOML file, ``PRORL_*`` variables and explicit overrides."""
    merged: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                merged.update(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from exc
    # Environment values are strings: str_values lets "64" become an int field.
    merged.update(_env_overrides(os.environ if env is None else env))
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        cfg = msgspec.convert(merged, ServerConfig, strict=False)
    except (msgspec.ValidationError, ValueError) as exc:
        raise ConfigError(f"invalid configuration: {exc}") from exc
    _check(cfg)
    if cfg.token_file is not None:
        cfg = msgspec.structs.replace(cfg, token=_read_token(cfg))
    if cfg.metrics_token_file is not None:
        if cfg.metrics_token is not None:
            raise ConfigError("metrics_token and metrics_token_file are both set: give one")
        scrape = _read_secret("metrics_token_file", cfg.metrics_token_file)
        cfg = msgspec.structs.replace(cfg, metrics_token=scrape)
    return _with_tenants_and_secret(cfg, os.environ if env is None else env)


def _with_tenants_and_secret(cfg: ServerConfig, env: Mapping[str, str]) -> ServerConfig:
    try:
        tenants = dict(cfg.tenants)
        if cfg.tokens_file is not None:
            tenants.update(read_tokens_file(cfg.tokens_file))
        callbacks = cfg.callbacks.with_secret(env)
    except (TenantsError, NotifyConfigError) as exc:
        raise ConfigError(str(exc)) from None
    problem = check_tenants(tenants, cfg.token) or callbacks.problem() or cfg.events.problem()
    if problem is not None:
        raise ConfigError(problem)
    return msgspec.structs.replace(cfg, tenants=tenants, callbacks=callbacks)


def _read_token(cfg: ServerConfig) -> str:
    assert cfg.token_file is not None
    if cfg.token is not None:
        raise ConfigError("token and token_file are both set: give one of them")
    return _read_secret("token_file", cfg.token_file)


def _read_secret(name: str, path: str) -> str:
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{name} {path}: {exc}") from exc
    if not token:
        raise ConfigError(f"{name} {path}: the file is empty")
    return token


def _check(cfg: ServerConfig) -> None:
    counts = ("init_workers", "run_workers", "eval_workers", "max_jobs", "max_batch")
    for name in (*counts, "max_connections"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.runtime not in ("auto", "bwrap", "apptainer", "local"):
        raise ConfigError(f"runtime must be auto, bwrap, apptainer or local, got {cfg.runtime!r}")
    if cfg.store not in ("sqlite", "memory"):
        raise ConfigError(f"store must be sqlite or memory, got {cfg.store!r}")
    if cfg.on_restart not in ("requeue", "fail"):
        raise ConfigError(f"on_restart must be requeue or fail, got {cfg.on_restart!r}")
    if cfg.sandbox_start not in ("eager", "on_first_use"):
        raise ConfigError(f"sandbox_start must be eager or on_first_use, got {cfg.sandbox_start!r}")
    if cfg.result_cache_bytes < 0:
        raise ConfigError(f"result_cache_bytes must be >= 0, got {cfg.result_cache_bytes}")
    positive = ("default_timeout_s", "max_wait_s", "retention_s", "read_timeout_s", "keepalive_s")
    for name in (*positive, "commit_timeout_s"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be > 0, got {getattr(cfg, name)}")
    try:
        cfg.sandbox.validate()
        cfg.sandbox_limits.validate()
    except (SpecError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    _check_capacity(cfg)


def _check_capacity(cfg: ServerConfig) -> None:
    if cfg.max_sandboxes is not None and cfg.max_sandboxes < 1:
        raise ConfigError(f"max_sandboxes must be >= 1, got {cfg.max_sandboxes}")
    if cfg.warm_sandboxes < 0:
        raise ConfigError(f"warm_sandboxes must be >= 0, got {cfg.warm_sandboxes}")
    problem = cfg.autoscaling.problem()
    if problem is not None:
        raise ConfigError(problem)
