"""nvim-dap's own requests, replayed in order: the session real nvim-dap had with the server on examples/gpt.py
(transcripts/nvim_dap.json, recorded by transcripts/record_nvim_dap.py from nvim-dap at a pinned commit in headless
Neovim) behaves the same today. Ids nvim-dap took from responses (frames, variable references, goto targets) are
matched to today's the way nvim-dap picks them: a scope or variable by name, a frame by place, a target by label."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dap.wire import GPT, ROOT, Debugger, line_of

TRANSCRIPT = json.loads((Path(__file__).parent / "transcripts" / "nvim_dap.json").read_text()
                        .replace("${root}", str(ROOT)))
AWAITED = ("initialized", "stopped", "terminated")  # events nvim-dap acted on before its next request
ID_OF_ITEMS = {"stackTrace": "frameId", "gotoTargets": "targetId", "threads": "threadId"}
SOFTMAX, AFTER_SOFTMAX = line_of("weights = torch.softmax"), line_of("out = (weights @ v)")


class Ids:
    """What each id nvim-dap recorded stands for in today's session, learned from response pairs."""

    def __init__(self) -> None:
        self.today: dict[str, dict[int, int]] = {kind: {} for kind in ("variablesReference", *ID_OF_ITEMS.values())}

    def learn(self, command: str, recorded, live) -> None:
        if isinstance(recorded, dict) and isinstance(live, dict):
            for key, value in recorded.items():
                kind = "variablesReference" if key == "variablesReference" else ID_OF_ITEMS.get(command) \
                    if key == "id" else None
                if kind and isinstance(value, int) and value > 0:
                    self.today[kind][value] = live[key]
                elif key in live:
                    self.learn(command, value, live[key])
        elif isinstance(recorded, list) and isinstance(live, list):
            assert len(recorded) == len(live), f"{command}: {len(live)} items where nvim-dap had {len(recorded)}"
            for index, item in enumerate(recorded):
                self.learn(command, item, _counterpart(item, index, live))

    def translate(self, arguments: dict | None) -> dict | None:
        if arguments is None:
            return None
        out = dict(arguments)
        for kind, ids in self.today.items():
            if kind in out:
                assert out[kind] in ids, f"nvim-dap sent {kind} {out[kind]}, which no response had given it"
                out[kind] = ids[out[kind]]
        return out


def _counterpart(item, index: int, live: list):
    """A scope or variable is the one of its name, a goto target the one of its label, anything else by place."""
    for key in ("name", "label"):
        if isinstance(item, dict) and key in item:
            return next((other for other in live if other.get(key) == item[key]), live[index])
    return live[index]


class Exchange:
    """One request of nvim-dap's: what it sent, the response and the awaited events it had before, and today's."""

    def __init__(self, sent: dict, recorded: dict, live: dict, recorded_events: list[tuple[str, dict]],
                 events: list[tuple[str, dict]]):
        self.command, self.sent, self.recorded, self.live = sent["command"], sent, recorded, live
        self.recorded_events, self.events = recorded_events, events


def replay(debugger: Debugger) -> list[Exchange]:
    """Send nvim-dap's requests in its order, each after the events it had waited for; keep every exchange."""
    messages = TRANSCRIPT["messages"]
    responses = {m["message"]["request_seq"]: m["message"] for m in messages
                 if m["from"] == "adapter" and m["message"]["type"] == "response"}
    ids, exchanges, awaited = Ids(), [], []
    for entry in messages:
        message = entry["message"]
        if entry["from"] == "adapter":
            if message["type"] == "event" and message["event"] in AWAITED:
                awaited.append((message["event"], message.get("body")))
            continue
        events = [(name, debugger.client.wait_for(name)) for name, _ in awaited]
        recorded = responses[message["seq"]]
        live = debugger.client.send(message["command"], ids.translate(message.get("arguments"))).wait(120)
        assert live.success == recorded["success"], f"{message['command']}: {live.body}"
        ids.learn(message["command"], recorded.get("body"), live.body)
        exchanges.append(Exchange(message, recorded, {"success": live.success, "body": live.body}, awaited, events))
        awaited = []
    return exchanges


@pytest.fixture(scope="module")
def session(schema) -> list[Exchange]:
    debugger = Debugger.spawn(schema)
    try:
        yield replay(debugger)
    finally:
        debugger.client.close()


def after(session: list[Exchange], command: str, nth: int = 0) -> tuple[dict, dict]:
    """The `nth` `command` request: the stopped event nvim-dap waited for after it, and the top frame it was shown."""
    index = [i for i, e in enumerate(session) if e.command == command][nth]
    heard = next(i for i in range(index + 1, len(session)) if any(name == "stopped" for name, _ in session[i].events))
    stopped = next(body for name, body in session[heard].events if name == "stopped")
    trace = next(e for e in session[heard:] if e.command == "stackTrace")
    return stopped, trace.live["body"]["stackFrames"][0]


def test_the_recording_is_of_nvim_dap_at_a_pinned_commit_and_replays_every_request(session):
    assert len(TRANSCRIPT["client"]["nvim-dap"]["commit"]) == 40 and "NVIM v0.11" in TRANSCRIPT["client"]["neovim"]
    assert session[0].sent["arguments"]["adapterID"] == "nvim-dap"
    commands = {e.command for e in session}
    assert commands >= {"initialize", "launch", "setBreakpoints", "setExceptionBreakpoints", "configurationDone",
                        "threads", "stackTrace", "scopes", "variables", "evaluate", "continue", "next", "stepBack",
                        "reverseContinue", "setVariable", "gotoTargets", "goto", "disconnect"}


def test_every_stop_is_where_nvim_dap_saw_it(session):
    for exchange in session:
        stopped = [body for name, body in exchange.events if name == "stopped"]
        recorded = [body for name, body in exchange.recorded_events if name == "stopped"]
        assert [(s["reason"], s.get("description")) for s in stopped] == \
            [(s["reason"], s.get("description")) for s in recorded]
        if exchange.command == "stackTrace":
            today, then = exchange.live["body"]["stackFrames"], exchange.recorded["body"]["stackFrames"]
            assert [(f["name"], f["line"]) for f in today] == [(f["name"], f["line"]) for f in then]
    assert sum(len(e.events) for e in session) >= 8


def test_launch_stops_at_the_breakpoint_nvim_dap_set_and_shows_the_frames_variables(session):
    stopped, top = after(session, "configurationDone")
    assert stopped["reason"] == "breakpoint" and top["line"] == SOFTMAX and "[blocks.0.attn]" in top["name"]
    scopes = next(e for e in session if e.command == "scopes").live["body"]["scopes"]
    cheap = [s for s in scopes if not s["expensive"]]
    fetched = [e for e in session if e.command == "variables"][:len(cheap)]
    assert len(cheap) < len(scopes)  # the whole-program scopes are not fetched on every stop
    locals_ = next(e for s, e in zip(cheap, fetched) if s["name"].startswith("Locals"))
    assert {"x", "q", "k", "v", "scores", "mask"} <= {v["name"] for v in locals_.live["body"]["variables"]}
    evaluated = next(e for e in session if e.command == "evaluate")
    assert evaluated.live["body"]["result"].startswith("float32[1, 4, 16, 16] cpu")


def test_continue_next_step_back_and_reverse_continue_move_as_nvim_dap_asked(session):
    _, second = after(session, "continue")
    assert second["line"] == SOFTMAX and "[blocks.1.attn]" in second["name"]
    _, stepped = after(session, "next")
    assert stepped["line"] == AFTER_SOFTMAX
    _, back = after(session, "stepBack")
    assert (back["name"], back["line"]) == (second["name"], second["line"])
    stopped, first = after(session, "reverseContinue")
    assert stopped["reason"] == "breakpoint" and first["line"] == SOFTMAX and "[blocks.0.attn]" in first["name"]


def test_set_variable_on_an_element_nvim_dap_expanded_is_a_step_it_hears_of(session):
    edit = next(e for e in session if e.command == "setVariable")
    assert edit.sent["arguments"]["name"] == "[0]" and edit.live["body"]["value"] == "0.5"
    stopped, top = after(session, "setVariable")
    assert stopped["reason"] == "step" and "edit" in stopped["description"]  # nvim-dap ignores `invalidated`
    checked = next(e for e in session if e.command == "evaluate" and e.sent["arguments"]["expression"] != "scores")
    assert checked.live["body"]["result"] == "float32[] cpu = 0.5"
    _, edit_frame = after(session, "stepBack", 1)
    assert edit_frame["name"].startswith("edit of") and edit_frame["line"] == line_of("scores = scores.masked_fill")


def test_goto_targets_from_a_file_uri_name_each_block_and_goto_lands_on_the_line(session):
    asked = next(e for e in session if e.command == "gotoTargets")
    assert asked.sent["arguments"]["source"]["path"] == GPT.as_uri()
    labels = [t["label"] for t in asked.live["body"]["targets"]]
    assert [label.rsplit(" in ", 1)[1] for label in labels] == ["blocks.0.attn", "blocks.1.attn"]
    stopped, top = after(session, "goto")
    assert stopped["reason"] == "goto" and top["line"] == AFTER_SOFTMAX and "[blocks.0.attn]" in top["name"]


def test_disconnect_ends_the_session(session):
    assert session[-1].command == "disconnect" and session[-1].live["success"]
