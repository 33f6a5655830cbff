"""Who is calling: each request's tenant from its bearer token, and what a tenant may call.

Every route but ``/healthz`` and ``/metrics`` needs a known token when any is configured
(401 otherwise). A tenant that is not ``admin`` may call only the routes of its own
jobs and of reading the server's state (``TENANT_ROUTES``); any other route, present or
added later (backends, workers, weights, start, stop), answers it 403.
"""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from prorl_async.core.errors import Forbidden, Unauthorized
from prorl_async.tenancy import Tenant, Tenants

__all__ = ["TENANT", "TENANTS", "TENANT_ROUTES", "tenant_middleware", "viewer"]

TENANT = web.RequestKey("tenant", Tenant)
TENANTS = web.AppKey("tenants", Tenants)
_OPEN_PATHS = frozenset({"/healthz", "/metrics"})
TENANT_ROUTES = frozenset(
    {
        ("POST", "/process"),
        ("POST", "/process/batch"),
        ("GET", "/jobs/{job_id}"),
        ("DELETE", "/jobs/{job_id}"),
        ("GET", "/jobs/{job_id}/callback"),
        ("POST", "/poll"),
        ("POST", "/cancel"),
        ("GET", "/results"),
        ("GET", "/events"),
        ("GET", "/status"),
        ("GET", "/openapi.json"),
    }
)


@web.middleware
async def tenant_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 without a known token, 403 for a non-admin on an admin route; else the
    request's ``TENANT`` is set (read it with ``viewer``)."""
    if request.path not in _OPEN_PATHS:
        tenant = request.app[TENANTS].authenticate(request.headers.get("Authorization", ""))
        if tenant is None:
            raise Unauthorized("missing or wrong bearer token in the Authorization header")
        if not tenant.admin and not _tenant_route(request):
            raise Forbidden(
                f"{request.method} {request.path}: an admin route, and tenant "
                f"{tenant.name!r} is not an admin"
            )
        request[TENANT] = tenant
    response: web.StreamResponse = await handler(request)
    return response


def _tenant_route(request: web.Request) -> bool:
    resource = request.match_info.route.resource
    if resource is None:
        return True  # no such route: the router answers 404 or 405
    method = "GET" if request.method == "HEAD" else request.method
    return (method, resource.canonical) in TENANT_ROUTES


def viewer(request: web.Request) -> Tenant:
    """The calling tenant (the admin tenant ``default`` on a server without tokens)."""
    return request[TENANT]
