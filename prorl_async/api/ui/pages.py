"""The ``/ui/`` routes (thin): the login form, the dashboard and its live JSON, one
trajectory, the results listing and the package's static files."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler

from prorl_async.api.params import query_int
from prorl_async.api.ui.dashboard import REFRESH_S
from prorl_async.api.ui.listing import STATUSES, Filters
from prorl_async.api.ui.render import Pages, secure
from prorl_async.api.ui.session import COOKIE, TTL_S, VIEWER, Sessions, guard_page, safe_next
from prorl_async.api.ui.state import UI, UiState
from prorl_async.api.ui.trajectory import build_view, timing_bars
from prorl_async.schemas import JobStatusResponse
from prorl_async.service import RolloutService
from prorl_async.tenancy import Tenant
from prorl_async.util.tasks import cancel_and_wait

__all__ = ["register_ui", "ui_routes"]

ui_routes = web.RouteTableDef()
PAGE_SIZE = 50
_MAX_CURSOR = 2**62


def register_ui(app: web.Application, svc: RolloutService) -> None:
    """The pages' shared state, and the dashboard's throughput sampler (the routes:
    ``ui_routes``, added with the others by ``api.access.add_routes``)."""
    app[UI] = UiState(svc)
    app.cleanup_ctx.append(_sampler_ctx)


async def _sampler_ctx(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[UI].dashboard.throughput.run(), name="ui-throughput")
    yield
    await cancel_and_wait(task)


def _state(request: web.Request) -> UiState:
    return request.app[UI]


def _parts(request: web.Request) -> tuple[Sessions, Pages]:
    state = request.app[UI]
    return state.sessions, state.pages


def page(handler: Handler) -> Handler:
    return guard_page(handler, _parts)


def _common(request: web.Request, viewer: Tenant | None) -> dict[str, Any]:
    state = _state(request)
    return {"viewer": viewer, "open_mode": state.sessions.open_mode}


# -- login ------------------------------------------------------------------------------


@ui_routes.get("/ui")
async def ui_root(request: web.Request) -> web.StreamResponse:
    raise web.HTTPMovedPermanently("/ui/")


@ui_routes.get("/ui/login")
async def login_form(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    if state.sessions.viewer(request) is not None:
        raise web.HTTPSeeOther(safe_next(request.query.get("next")))
    return _login_page(request, 200, "")


def _login_page(request: web.Request, status: int, error: str) -> web.Response:
    target = safe_next(request.query.get("next"))
    return _state(request).pages.html(
        "login.html", status=status, error=error, next=target, **_common(request, None)
    )


def _other_origin(request: web.Request) -> web.Response | None:
    """A form POST from another site (``Origin`` names it) is refused: the 403 page."""
    origin = request.headers.get("Origin")
    if origin is None or origin == f"{request.scheme}://{request.host}":
        return None
    detail = f"a form posted from {origin}, not from this server"
    return _state(request).pages.html(
        "error.html", status=403, title="Forbidden", detail=detail, **_common(request, None)
    )


@ui_routes.post("/ui/login")
async def login(request: web.Request) -> web.StreamResponse:
    refused = _other_origin(request)
    if refused is not None:
        return refused
    form = await request.post()
    token = form.get("token")
    target = safe_next(str(form.get("next") or "/ui/"))
    sid = _state(request).sessions.login(token) if isinstance(token, str) and token else None
    if sid is None:
        return _login_page(request, 401, "Unknown token.")
    resp = web.HTTPSeeOther(target, headers={"Cache-Control": "no-store"})
    resp.set_cookie(
        COOKIE,
        sid,
        httponly=True,
        samesite="Strict",
        path="/ui",
        secure=request.secure,
        max_age=int(TTL_S),
    )
    raise resp


@ui_routes.post("/ui/logout")
async def logout(request: web.Request) -> web.StreamResponse:
    refused = _other_origin(request)
    if refused is not None:
        return refused
    _state(request).sessions.logout(request.cookies.get(COOKIE))
    resp = web.HTTPSeeOther("/ui/login")
    resp.del_cookie(COOKIE, path="/ui")
    raise resp


@ui_routes.get("/ui/static/{name}")
async def static(request: web.Request) -> web.StreamResponse:
    return _state(request).pages.asset(request.match_info["name"])


# -- the dashboard ----------------------------------------------------------------------


@ui_routes.get("/ui/")
@page
async def dashboard(request: web.Request) -> web.StreamResponse:
    viewer = request[VIEWER]
    _, snap = await _state(request).dashboard.snapshot(viewer)
    return _state(request).pages.html(
        "dashboard.html", snap=snap, refresh_s=REFRESH_S, **_common(request, viewer)
    )


async def _live(request: web.Request) -> web.StreamResponse:
    body, _ = await _state(request).dashboard.snapshot(request[VIEWER])
    return secure(web.Response(body=body, content_type="application/json"))


ui_routes.get("/ui/live")(guard_page(_live, _parts, page=False))


# -- one trajectory ---------------------------------------------------------------------


@ui_routes.get("/ui/jobs/{job_id}")
@page
async def job(request: web.Request) -> web.StreamResponse:
    state, viewer = _state(request), request[VIEWER]
    job_id = request.match_info["job_id"]
    answer = await state.browser.result(job_id, viewer)
    owner = state.browser.owner(job_id, viewer)
    common = _common(request, viewer)
    if isinstance(answer, JobStatusResponse):
        return state.pages.html("pending.html", job_id=job_id, job_status=answer.status, **common)
    doc = msgspec.json.decode(answer)
    # A long trajectory is tens of thousands of elements: built off the event loop.
    text = await asyncio.to_thread(_job_page, state, doc, owner, common)
    return secure(web.Response(text=text, content_type="text/html", charset="utf-8"))


def _job_page(state: UiState, doc: dict[str, Any], owner: str, common: dict[str, Any]) -> str:
    prompt = state.browser.decode(doc.get("prompt_ids") or [])
    texts = state.browser.token_texts(doc.get("response_ids") or [])
    view = build_view(doc, prompt, texts)
    eval_rows = [(k, _shown(v)) for k, v in (doc.get("eval") or {}).items()]
    return state.pages.render(
        "job.html",
        doc=doc,
        owner=owner,
        view=view,
        bars=timing_bars(doc.get("timing")),
        eval_rows=eval_rows,
        metadata=_shown(doc.get("metadata") or {}),
        **common,
    )


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


# -- the results listing ----------------------------------------------------------------


@ui_routes.get("/ui/results")
@page
async def results(request: web.Request) -> web.StreamResponse:
    state, viewer = _state(request), request[VIEWER]
    filters = Filters.parse(dict(request.query), viewer)
    # An empty field of the filter form means no cursor.
    before = (
        query_int(request.query, "before", None, _MAX_CURSOR)
        if request.query.get("before")
        else None
    )
    rows, nxt = await state.rows.page(viewer, filters, before, PAGE_SIZE)
    query = {k: v for k, v in msgspec.structs.asdict(filters).items() if v is not None}
    return state.pages.html(
        "results.html",
        rows=rows,
        filters=filters,
        query=query,
        next_cursor=nxt,
        before=before,
        statuses=STATUSES,
        tenants=state.browser.visible_tenants(viewer) if viewer.admin else [],
        **_common(request, viewer),
    )


# -- anything else under /ui/ -----------------------------------------------------------


@ui_routes.get("/ui/{tail:.*}")
@page
async def unknown(request: web.Request) -> web.StreamResponse:
    raise web.HTTPNotFound(text=f"no page at {request.path}")
