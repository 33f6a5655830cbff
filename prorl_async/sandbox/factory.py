"""Choosing and building a sandbox runtime by name (``--runtime``)."""

from __future__ import annotations

import logging

from prorl_async.sandbox.apptainer import ApptainerRuntime
from prorl_async.sandbox.bwrap import BwrapRuntime, bwrap_problem
from prorl_async.sandbox.local import LocalRuntime
from prorl_async.sandbox.runtime import Runtime
from prorl_async.sandbox.spec import RuntimeConfig

__all__ = ["get_runtime"]

log = logging.getLogger(__name__)


def get_runtime(name: str, config: RuntimeConfig | None = None) -> Runtime:
    """``bwrap``, ``apptainer``, ``local`` or ``auto`` (bwrap where it works, else local)."""
    config = config if config is not None else RuntimeConfig()
    if name == "auto":
        problem = bwrap_problem(config.bwrap)
        if problem is None:
            return BwrapRuntime(config)
        log.warning("runtime auto: bwrap unusable (%s); falling back to the local runtime", problem)
        return LocalRuntime(config)
    kinds: dict[str, type[Runtime]] = {
        "bwrap": BwrapRuntime,
        "apptainer": ApptainerRuntime,
        "local": LocalRuntime,
    }
    if name not in kinds:
        raise ValueError(
            f"runtime: unknown runtime {name!r}; choose bwrap, apptainer, local or auto"
        )
    return kinds[name](config)
