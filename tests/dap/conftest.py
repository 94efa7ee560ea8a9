"""Fixtures for the DAP tests: one schema check for the whole run, servers shared per module where they can be."""

from __future__ import annotations

import pytest

from tests.dap.wire import GPT, Debugger, SchemaCheck
from tests.forensics_cases import FORENSICS


@pytest.fixture(scope="session")
def schema() -> SchemaCheck:
    return SchemaCheck()


@pytest.fixture(autouse=True)
def every_message_follows_the_schema(schema: SchemaCheck):
    before = len(schema.failures)
    yield
    assert schema.failures[before:] == [], "messages that break the DAP schema"


@pytest.fixture(scope="module")
def gpt(schema: SchemaCheck):
    """A server with examples/gpt.py loaded and stopped on entry; tests reset it before use."""
    debugger = Debugger.spawn(schema)
    stop = debugger.start(GPT, stopOnEntry=True)
    assert stop["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def fresh(gpt: Debugger) -> Debugger:
    gpt.reset()
    return gpt


@pytest.fixture(scope="module")
def softmax_server(schema: SchemaCheck):
    """A server with the planted softmax-overflow model loaded and stopped on entry."""
    debugger = Debugger.spawn(schema)
    assert debugger.start(FORENSICS / "softmax_overflow.py", stopOnEntry=True)["reason"] == "entry"
    yield debugger
    debugger.close()


@pytest.fixture
def debugger(softmax_server: Debugger) -> Debugger:
    return softmax_server
