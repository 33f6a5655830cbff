"""What the pages share, one per app (``UI``): sessions, templates, the result browser,
the listing's row cache and the dashboard."""

from __future__ import annotations

from aiohttp import web

from prorl_async.api.ui.dashboard import Dashboard
from prorl_async.api.ui.listing import Rows
from prorl_async.api.ui.render import Pages
from prorl_async.api.ui.session import Sessions
from prorl_async.service import RolloutService
from prorl_async.service.browse import ResultBrowser

__all__ = ["UI", "UiState"]


class UiState:
    def __init__(self, svc: RolloutService) -> None:
        self.sessions = Sessions(svc.tenants)
        self.pages = Pages()
        self.browser = ResultBrowser(svc)
        self.rows = Rows(self.browser)
        self.dashboard = Dashboard(svc, self.browser, self.rows)


UI = web.AppKey("ui", UiState)
