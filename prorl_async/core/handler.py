"""The task plugin interface (``AgentHandler``) and its registry.

A task domain is one module in the top-level ``handlers`` package, or a class
exposed by a separately installed package under the entry-point group
``prorl_async.handlers``. Either way the server needs no change.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from abc import ABC, abstractmethod
from importlib.metadata import entry_points
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

if TYPE_CHECKING:
    from prorl_async.config import ServerConfig
    from prorl_async.core.job import Job

__all__ = ["ENTRY_POINT_GROUP", "AgentHandler", "HandlerRegistry", "InstanceError"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "prorl_async.handlers"


class InstanceError(ValueError):
    """A task instance its handler rejects (answered 422); the message names the field."""


class AgentHandler(ABC):
    """One task domain: subclass, set ``name``, implement ``run`` (usually ``init``/``eval``).

    Stage methods are coroutines and may be cancelled at any await (timeout, cancel,
    stop). Anything that owns a process belongs in ``await job.hold(cm)`` so the
    pipeline releases it after RUN, on failure and on cancel. The ``*_exception``
    callbacks are synchronous: record what happened, do not start I/O.
    """

    name: ClassVar[str] = ""
    # Instances are validated into this struct when set (422 names the bad field).
    instance_type: ClassVar[type[Any] | None] = None

    def validate(self, instance: dict[str, Any]) -> Any:
        """Check and convert a submitted instance; raise ``InstanceError`` to reject it."""
        if self.instance_type is None:
            return instance
        try:
            return msgspec.convert(instance, self.instance_type)
        except msgspec.ValidationError as exc:
            raise InstanceError(f"instance: {_field_path(str(exc))}") from None

    def admit(self, instance: Any, config: ServerConfig) -> None:
        """Reject (``InstanceError``) a valid instance this server's configuration forbids."""

    async def init(self, job: Job) -> None:
        """Prepare the job: start its sandbox and tools."""

    @abstractmethod
    async def run(self, job: Job) -> None:
        """Drive the agent loop; store the trajectory on ``job.trajectory``."""

    async def eval(self, job: Job) -> None:
        """Score the job: set ``job.reward`` (and details in ``job.eval``)."""

    def init_exception(self, job: Job, exc: BaseException) -> None:
        """INIT failed or timed out."""

    def run_exception(self, job: Job, exc: BaseException) -> None:
        """RUN failed or timed out."""

    def eval_exception(self, job: Job, exc: BaseException) -> None:
        """EVAL failed or timed out."""

    def final_result(self, job: Job) -> dict[str, Any]:
        """Extra top-level fields for the job's result document (called once, at the end)."""
        return {}

    async def aclose(self) -> None:
        """Release app-wide resources the handler holds (called at server shutdown)."""


def _field_path(message: str) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.run_s`": keep it, it names the field.
    return message.replace("$.", "instance.").replace("at `$`", "at `instance`")


def _handler_classes(module: ModuleType) -> list[type[AgentHandler]]:
    found = []
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if (
            issubclass(obj, AgentHandler)
            and obj.__module__ == module.__name__
            and obj.name
            and not inspect.isabstract(obj)
        ):
            found.append(obj)
    return found


class HandlerRegistry:
    """Handlers keyed by task name."""

    def __init__(self) -> None:
        self._handlers: dict[str, AgentHandler] = {}

    def register(self, handler: AgentHandler) -> None:
        if not handler.name:
            raise ValueError(f"{type(handler).__name__} has no task name")
        if handler.name in self._handlers:
            log.warning("task %r registered twice; keeping the later one", handler.name)
        self._handlers[handler.name] = handler

    def get(self, task: str) -> AgentHandler | None:
        return self._handlers.get(task)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def handlers(self) -> list[AgentHandler]:
        return list(self._handlers.values())

    def load_package(self, package: str = "handlers") -> None:
        """Register every handler class defined in the modules of ``package``."""
        pkg = importlib.import_module(package)
        for info in pkgutil.iter_modules(pkg.__path__, prefix=f"{package}."):
            if info.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            try:
                module = importlib.import_module(info.name)
            except Exception:
                log.exception(
                    "handler module %s failed to import; its tasks are unavailable", info.name
                )
                continue
            for cls in _handler_classes(module):
                self.register(cls())

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Register handlers advertised by installed packages."""
        for ep in entry_points(group=group):
            try:
                obj = ep.load()
                handler = obj() if inspect.isclass(obj) else obj
            except Exception:
                log.exception("handler entry point %s failed to load", ep.name)
                continue
            if not isinstance(handler, AgentHandler):
                log.error("entry point %s is not an AgentHandler", ep.name)
                continue
            self.register(handler)

    @classmethod
    def discover(cls) -> HandlerRegistry:
        registry = cls()
        registry.load_package()
        registry.load_entry_points()
        return registry
