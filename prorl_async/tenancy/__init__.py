"""Tenants: who a bearer token is, what it may do, how much it may queue, its share."""

from prorl_async.tenancy.config import (
    DEFAULT_TENANT,
    TenantConfig,
    TenantsError,
    check_tenants,
    read_tokens_file,
)
from prorl_async.tenancy.ledger import Tenant, Tenants

__all__ = [
    "DEFAULT_TENANT",
    "Tenant",
    "TenantConfig",
    "Tenants",
    "TenantsError",
    "check_tenants",
    "read_tokens_file",
]
