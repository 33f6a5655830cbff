"""The in-sandbox tool server: bash, python, file editing and file transfer over a Unix socket."""

from prorl_async.toolserver.protocol import FrameError, Request, Response
from prorl_async.toolserver.server import ToolServer

__all__ = ["FrameError", "Request", "Response", "ToolServer"]
