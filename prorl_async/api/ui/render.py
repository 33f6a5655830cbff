"""Pages from the package's templates, the package's static files, and the headers every
``/ui/`` answer carries (a strict Content-Security-Policy: no inline script or style, no
request to another origin)."""

from __future__ import annotations

import importlib.resources
import mimetypes
from typing import Any

import jinja2
from aiohttp import web

__all__ = ["CSP", "Pages", "secure"]

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no referrer a form POST says `Origin: null`.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_ASSETS = importlib.resources.files("prorl_async") / "assets" / "ui"


def secure(resp: web.StreamResponse, *, cache: bool = False) -> web.StreamResponse:
    """Add the ``/ui/`` security headers (and ``no-store`` unless ``cache``)."""
    resp.headers.update(_HEADERS)
    resp.headers.setdefault("Cache-Control", "max-age=300" if cache else "no-store")
    return resp


class Pages:
    """The Jinja environment (autoescaping on: everything from a rollout is text) and the
    static files, read once from the package."""

    def __init__(self) -> None:
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("prorl_async", "assets/ui/templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        static = _ASSETS / "static"
        self.static: dict[str, tuple[bytes, str]] = {
            f.name: (f.read_bytes(), _content_type(f.name)) for f in static.iterdir() if f.is_file()
        }

    def html(self, template: str, status: int = 200, **context: Any) -> web.Response:
        """``template`` rendered with ``context``, as a secured HTML answer."""
        text = self.env.get_template(template).render(**context)
        resp = web.Response(text=text, status=status, content_type="text/html", charset="utf-8")
        secure(resp)
        return resp

    def render(self, template: str, **context: Any) -> str:
        """``template`` rendered to text (to build a big page off the event loop)."""
        return self.env.get_template(template).render(**context)

    def asset(self, name: str) -> web.Response:
        """A static file of the package (``NotFound`` for any other name)."""
        found = self.static.get(name)
        if found is None:
            raise web.HTTPNotFound()
        body, ctype = found
        resp = web.Response(body=body, content_type=ctype)
        secure(resp, cache=True)
        return resp


def _content_type(name: str) -> str:
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    return "application/javascript" if name.endswith(".js") else kind
