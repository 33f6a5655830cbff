"""The web pages under ``/ui/``: a live dashboard, one trajectory token by token, and the
results listing, behind a login form (docs/API.md "Web pages")."""

from __future__ import annotations

from prorl_async.api.ui.pages import register_ui, ui_routes

__all__ = ["register_ui", "ui_routes"]
