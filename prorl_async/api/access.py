"""Who is calling, and every route's guard: each request's tenant from its bearer token,
what a tenant may call, and errors answered as problem+json.

Every route but ``/healthz`` needs a known token when any is configured (401 otherwise).
A tenant that is not ``admin`` may call only the routes of its own jobs and of reading
the server's state (``TENANT_ROUTES``); any other route, present or added later
(backends, workers, weights, start, stop), answers it 403. ``/metrics`` names every
tenant: it answers an admin's token or the scrape token (``metrics_token_file``) only.

Each route's handler is wrapped once, when the app is built (``add_routes``), with what
it needs decided then: whether its path is open, whether a tenant may call it. aiohttp
middlewares would do the same per request, through a coroutine per middleware plus the
one aiohttp adds to every app that has any: measured ~7 µs of server CPU a request,
~4% of a single submit (docs/performance.md, the request path). A wrong method on a
known path and an unknown path are answered by routes of their own, guarded the same
way: 405 and 404 as problem+json, after the token check, as every other answer.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from prorl_async.api.problems import error_response
from prorl_async.core.errors import Forbidden, Unauthorized
from prorl_async.tenancy import Tenant, Tenants

__all__ = ["TENANT", "TENANT_ROUTES", "add_routes", "guarded", "viewer"]

TENANT = web.RequestKey("tenant", Tenant)
_OPEN_PATHS = frozenset({"/healthz"})
SCRAPE_PATH = "/metrics"
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


def guarded(
    handler: Handler,
    tenants: Tenants,
    *,
    open_path: bool,
    tenant_route: bool,
    scrape_token: str | None = None,
) -> Handler:
    """``handler`` behind the token check (unless ``open_path``; 403 for a non-admin
    unless ``tenant_route``; ``scrape_token`` also passes), its errors answered as
    problem+json. The request's ``TENANT`` is set for the handler (read it with
    ``viewer``)."""
    scrape = None if scrape_token is None else b"Bearer " + scrape_token.encode()

    async def guard(request: web.Request) -> web.StreamResponse:
        try:
            header = request.headers.get("Authorization", "")
            if scrape is not None and hmac.compare_digest(
                header.encode("utf-8", "surrogateescape"), scrape
            ):
                return await handler(request)
            if not open_path:
                tenant = tenants.authenticate(header)
                if tenant is None:
                    raise Unauthorized("missing or wrong bearer token in the Authorization header")
                if not tenant_route and not tenant.admin:
                    raise Forbidden(
                        f"{request.method} {request.path}: an admin route, and tenant "
                        f"{tenant.name!r} is not an admin"
                    )
                request[TENANT] = tenant
            return await handler(request)
        except Exception as exc:
            if isinstance(exc, web.HTTPException) and exc.status < 400:
                raise  # a redirect is an answer
            return error_response(request, exc)

    guard.__name__ = guard.__qualname__ = getattr(handler, "__name__", "guard")
    return guard


def add_routes(
    app: web.Application,
    tenants: Tenants,
    tables: Iterable[Iterable[web.AbstractRouteDef]],
    scrape_token: str | None = None,
    session_tables: Iterable[Iterable[web.AbstractRouteDef]] = (),
) -> None:
    """Add every route of ``tables``, each guarded (``guarded``); then, on each path, a
    route for any other method (405, naming the allowed ones) and a last route for any
    other path (404). ``scrape_token`` opens ``/metrics`` besides an admin's token.
    ``session_tables`` are the web pages' (``api/ui``): no bearer token, as a browser
    sends none; their handlers check the login cookie themselves. Call once, after
    nothing else adds routes."""
    sessions = [list(t) for t in session_tables]
    open_paths = _OPEN_PATHS | {r.path for t in sessions for r in t if isinstance(r, web.RouteDef)}
    for table in [*tables, *sessions]:
        for route in table:
            if not isinstance(route, web.RouteDef):
                raise TypeError(f"only plain routes are guarded, not {route!r}")
            # Our paths have no regular expressions (the pages' last one, /ui/{tail:.*},
            # aside): each is its own canonical form.
            tenant_route = (route.method, route.path) in TENANT_ROUTES
            handler = guarded(
                route.handler,
                tenants,
                open_path=route.path in open_paths,
                tenant_route=tenant_route,
                scrape_token=scrape_token if route.path == SCRAPE_PATH else None,
            )
            web.RouteDef(route.method, route.path, handler, route.kwargs).register(app.router)
    # A path's routes may sit in several resources (routes of one path added apart): the
    # any-method route goes on its last one, after all of them, naming all their methods.
    last: dict[str, web.Resource] = {}
    allowed: dict[str, set[str]] = {}
    for resource in app.router.resources():
        if not isinstance(resource, web.Resource):
            raise TypeError(f"only plain routes are guarded, not {resource!r}")
        last[resource.canonical] = resource
        allowed.setdefault(resource.canonical, set()).update(r.method for r in resource)
    for path, resource in last.items():
        wrong_method = guarded(
            _method_not_allowed(allowed[path]),
            tenants,
            open_path=path in open_paths or path.startswith("/ui/"),
            tenant_route=True,  # answering which methods exist gives a tenant nothing
        )
        resource.add_route(hdrs.METH_ANY, wrong_method)
    unknown = guarded(_not_found, tenants, open_path=False, tenant_route=True)
    app.router.add_route(hdrs.METH_ANY, "/{tail:.*}", unknown)


def _method_not_allowed(allowed: set[str]) -> Handler:
    async def method_not_allowed(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMethodNotAllowed(request.method, allowed)

    return method_not_allowed


async def _not_found(request: web.Request) -> web.StreamResponse:
    raise web.HTTPNotFound()


def viewer(request: web.Request) -> Tenant:
    """The calling tenant (the admin tenant ``default`` on a server without tokens)."""
    return request[TENANT]
