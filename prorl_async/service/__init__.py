"""The service: ``RolloutService``, the one façade every client path goes through, and
the ``/status`` document it assembles (``status``)."""

from __future__ import annotations

from prorl_async.service.rollout import RolloutService

__all__ = ["RolloutService"]
