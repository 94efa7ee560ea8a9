"""readReference: the reference run's bytes of a value, read as readMemory reads this run's.

The Tensor view draws a value's difference from the reference element by element: it asks for
the reference's layout (dtype, shape, strides: `count` 0), then for the bytes of the slice it
shows. The reference is the session's (provenance/forensics.py), computed on first use.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import torch
from pydantic import Field

from dap_server.memory import MAX_READ_BYTES
from dap_server.requests import StrictArguments, request

if TYPE_CHECKING:
    from dap_server.context import RequestContext  # the adapter, as far as handlers use it


class ReadReferenceArguments(StrictArguments):
    name: str  # a source variable (`scores`) or a Program value (`div`)
    frameId: int | None = None
    offset: int = Field(0, ge=0)  # bytes from the value's first element
    count: int = Field(0, ge=0, le=MAX_READ_BYTES)


@request("readReference")
def read_reference(adapter: "RequestContext", args: ReadReferenceArguments) -> dict:
    value = adapter.resolve_value(args.name, adapter.frame_level(args.frameId))
    forensics = adapter.session.forensics
    with adapter.events.progress(f"Reading the reference's '{value}'", cancellable=False):
        tensor = forensics.reference.value(value).contiguous()
    data = tensor.reshape(-1).view(torch.uint8)[args.offset:args.offset + args.count]
    return {"value": value, "reference": forensics.spec, "dtype": str(tensor.dtype).removeprefix("torch."),
            "shape": list(tensor.shape), "strides": list(tensor.stride()),
            "data": base64.b64encode(data.numpy().tobytes()).decode("ascii")}
