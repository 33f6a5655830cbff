"""The ``[tenants.NAME]`` tables: from ``--tokens-file`` (TOML, mode 600) or the config file.

```toml
[tenants.run-a]
token = "..."          # the bearer token of this tenant
max_inflight = 2000    # jobs queued + running; default unlimited
weight = 1             # share of the server under contention; default 1
admin = false          # may manage backends, workers, weights, stop; default false
```
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

__all__ = ["DEFAULT_TENANT", "TenantConfig", "TenantsError", "check_tenants", "read_tokens_file"]

# The tenant of the single token (PRORL_TOKEN, --token-file) and of a server without tokens.
DEFAULT_TENANT = "default"
# A tenant name is a Prometheus label value and appears in logs: keep it plain.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class TenantsError(ValueError):
    """A tokens file or tenant table is wrong; the message names the file and the key."""


class TenantConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """One tenant: its bearer token, its quota, its weight, whether it administers."""

    token: Annotated[str, msgspec.Meta(min_length=1)]
    # Jobs queued + running at once; a submit beyond it is answered 429. None: unlimited.
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Share of INIT admissions under contention (weighted deficit round robin).
    weight: Annotated[float, msgspec.Meta(ge=0.01, le=1000)] = 1.0
    # May call the admin routes (backends, workers, weights, start, stop).
    admin: bool = False


class _TokensFile(msgspec.Struct, forbid_unknown_fields=True):
    tenants: dict[str, TenantConfig]


def read_tokens_file(path: str) -> dict[str, TenantConfig]:
    """The tenants of a tokens file; refuses a file other users may read (like ``ssh``)."""
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TenantsError(
                f"tokens_file {path}: mode {stat.S_IMODE(mode):04o} lets other users read "
                "the tokens; chmod 600 it"
            )
        with open(path, "rb") as f:
            raw: dict[str, Any] = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TenantsError(f"tokens_file {path}: {exc}") from None
    try:
        tenants = msgspec.convert(raw, _TokensFile).tenants
    except msgspec.ValidationError as exc:
        raise TenantsError(f"tokens_file {path}: {exc}") from None
    problem = check_tenants(tenants)
    if problem is not None:
        raise TenantsError(f"tokens_file {path}: {problem}")
    return tenants


def check_tenants(
    tenants: Mapping[str, TenantConfig], single_token: str | None = None
) -> str | None:
    """What is wrong with a set of tenants (with the single token beside them), or None."""
    seen: dict[str, str] = {}
    if single_token:
        if DEFAULT_TENANT in tenants:
            return (
                f"tenants.{DEFAULT_TENANT}: the name is taken by the single token "
                "(PRORL_TOKEN, token, token_file); rename the tenant"
            )
        seen[single_token] = "the single token"
    for name, tenant in tenants.items():
        if not _NAME.match(name):
            return f"tenants.{name}: a name is 1-64 letters, digits and ._- (first not . _ -)"
        other = seen.get(tenant.token)
        if other is not None:
            return f"tenants.{name}.token: the same token as {other}; each tenant needs its own"
        seen[tenant.token] = f"tenants.{name}"
    return None
