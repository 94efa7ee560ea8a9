"""attach: a client that found this adapter already listening (python -m dap_server --port N).

Every connection is a session of its own, so attaching loads the program as launch does. The
configuration's `port` and `host` told the client where to connect; they mean nothing here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from dap_server.lifecycle import LaunchArguments, launch
from dap_server.requests import request

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class AttachArguments(LaunchArguments):
    port: int | None = Field(None, ge=1, le=65535)
    host: str | None = None


@request("attach")
def attach(adapter: "RequestContext", args: AttachArguments) -> None:
    launch(adapter, args)
