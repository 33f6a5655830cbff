"""Who is looking: the login form's session cookie, and the guard around every page.

The form takes a bearer token (the API's) and sets a random session id in an
``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/ui``; the token itself is kept
nowhere, and never travels in a URL. Sessions live in this process (a restart asks for
the token again), at most ``MAX_SESSIONS`` (the oldest go first), each ``TTL_S`` long.
On a server without tokens (open mode) every visitor is the admin tenant ``default``, as
on the API, and no login is asked for.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Handler

from prorl_async.api.ui.render import Pages, secure
from prorl_async.core.errors import ProblemError
from prorl_async.tenancy import Tenant, Tenants

__all__ = ["COOKIE", "VIEWER", "Sessions", "guard_page", "safe_next"]

log = logging.getLogger(__name__)

COOKIE = "prorl_ui"
VIEWER = web.RequestKey("ui_viewer", Tenant)
TTL_S = 12 * 3600.0
MAX_SESSIONS = 10_000


class Sessions:
    """Session id -> tenant, bounded and expiring."""

    def __init__(self, tenants: Tenants) -> None:
        self.tenants = tenants
        self._by_id: OrderedDict[str, tuple[Tenant, float]] = OrderedDict()

    @property
    def open_mode(self) -> bool:
        """No token is configured: everyone is the admin tenant ``default``."""
        return not self.tenants.auth_required

    def login(self, token: str) -> str | None:
        """A new session id for ``token``'s tenant, or None for an unknown token."""
        tenant = self.tenants.authenticate(f"Bearer {token}")
        if tenant is None or self.open_mode:
            return None
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = (tenant, time.monotonic() + TTL_S)
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return sid

    def logout(self, sid: str | None) -> None:
        if sid is not None:
            self._by_id.pop(sid, None)

    def viewer(self, request: web.Request) -> Tenant | None:
        """The request's tenant: from its cookie, or ``default`` in open mode."""
        if self.open_mode:
            return self.tenants.authenticate("")
        sid = request.cookies.get(COOKIE)
        found = None if sid is None else self._by_id.get(sid)
        if found is None:
            return None
        tenant, expires = found
        if time.monotonic() > expires:
            del self._by_id[sid]  # type: ignore[arg-type]
            return None
        return tenant


def safe_next(target: str | None) -> str:
    """Where to go after the login: a ``/ui/`` path of this server only (no open redirect)."""
    if target and target.startswith("/ui/") and "//" not in target and "\\" not in target:
        return target
    return "/ui/"


def guard_page(
    handler: Handler, state: Callable[[web.Request], tuple[Sessions, Pages]], *, page: bool = True
) -> Handler:
    """``handler`` for a logged-in viewer (``request[VIEWER]``). Without a session a page
    redirects to the login form and anything else (``page=False``) answers 401; errors
    become an HTML page with their status. ``state`` finds the app's sessions and pages."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        sessions, pages = state(request)
        viewer = sessions.viewer(request)
        if viewer is None:
            if not page:
                return secure(web.json_response({"detail": "log in at /ui/login"}, status=401))
            where = quote(request.path_qs, safe="/")  # its own query stays inside `next`
            raise web.HTTPSeeOther(f"/ui/login?next={where}", headers=_no_store())
        request[VIEWER] = viewer
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(pages, request, exc.status, exc.reason, exc.text or exc.reason)
        except ProblemError as exc:
            return _error(pages, request, exc.status, exc.title, exc.detail)

    guarded.__name__ = guarded.__qualname__ = getattr(handler, "__name__", "guarded")
    return guarded


def _no_store() -> dict[str, str]:
    return {"Cache-Control": "no-store"}


def _error(
    pages: Pages, request: web.Request, status: int, title: str, detail: str
) -> web.Response:
    viewer = request.get(VIEWER)
    return pages.html(
        "error.html", status=status, title=title, detail=detail, viewer=viewer, open_mode=False
    )
