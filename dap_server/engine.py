"""An engine process: one debug session (its Session, the request handlers, the user's code) behind a pipe.

The front (dap_server/server.py) starts one per session as `python -m dap_server.engine` and speaks to it
over its stdin and stdout with the messages of dap_server/channel.py. Before anything else runs, the
channel moves to private descriptors: the program's stdin reads nothing, and what the program prints on
stdout reaches the client as `output` events (the first MAX_PROGRAM_OUTPUT bytes; the rest is dropped and
counted), so nothing the program does can write into the channel. The process starts in the front's working
directory and moves into the one a launch gives (`cwd`, dap_server/paths.py): the program runs there.

The engine ends when the client disconnects or the front closes the pipe. A program that exits, crashes
or hangs ends only this process: the front notices, answers what was pending and keeps serving.

A launch with `ranks` makes the session's engine a coordinator of many engines, one per rank, forked by
`python -m dap_server.engine --rank-launcher FD` (hardware/ranks/launcher.py): each is a RankAdapterEngine,
moved by the coordinator and answering, with the usual handlers over its own Session, the DAP requests about its
rank that dap_server/ranks.py forwards to it.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import logging
import os
import sys
import threading
from typing import Callable

from dap_server import channel, paths
from dap_server.adapter import Adapter
from dap_server.dispatch import Dispatcher
from dap_server.ranks import RankVariables
from dap_server.requests import REQUESTS
from hardware.errors import RewindError
from hardware.events import Output
from hardware.ranks.launcher import serve as serve_ranks
from hardware.ranks.worker import FencedSession, RankEngine, join_as_rank, run_rank

log = logging.getLogger("dap_server")
MAX_PROGRAM_OUTPUT = 2**20  # bytes of the program's stdout shown to the client per session
WORKER_GRACE_S = 20.0  # how long the session's last work (finishing a recording) may take once the client is gone


class ProgramOutput(threading.Thread):
    """Reads what the program prints and hands it on as `output` events, up to a limit; always drains the pipe,
    so a program printing without end never blocks on a full pipe."""

    def __init__(self, fd: int, emit: Callable[[str, dict], None]):
        super().__init__(name="rewind-program-output", daemon=True)
        self.fd, self.emit = fd, emit
        self.shown = self.dropped = 0

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while chunk := os.read(self.fd, 1 << 16):
            shown = chunk[:max(0, MAX_PROGRAM_OUTPUT - self.shown)]
            self.dropped += len(chunk) - len(shown)
            if not shown:
                continue
            self.shown += len(shown)
            if text := decoder.decode(shown):
                self.emit("output", {"category": "stdout", "output": text})
            if self.shown >= MAX_PROGRAM_OUTPUT:
                self.emit("output", {"category": "important", "output": (
                    f"\nThe program printed more than {MAX_PROGRAM_OUTPUT // 2**20} MiB: the rest of its output "
                    "is not shown.\n")})


async def serve(fd_in: int, fd_out: int, output_fd: int) -> Dispatcher:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=channel.MAX_FRAME)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd_in, "rb", buffering=0))
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(fd_out, "wb", buffering=0))

    def deliver(message: channel.Message) -> None:
        if not transport.is_closing():
            transport.write(channel.pack(message))

    def notify(kind: str, body: dict) -> None:  # from the worker thread
        if kind == "recording":
            frame = channel.pack(channel.Recording(str(body["partial"]), str(body["target"]), bool(body["overwrite"])))
            loop.call_soon_threadsafe(lambda: transport.is_closing() or transport.write(frame))

    dispatcher = Dispatcher(deliver, notify)
    ProgramOutput(output_fd, dispatcher.emit).start()
    reading = asyncio.ensure_future(_read(reader, dispatcher))
    disconnected = asyncio.ensure_future(dispatcher.done.wait())
    await asyncio.wait({reading, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    reading.cancel()
    disconnected.cancel()
    dispatcher.close()
    for _ in range(200):  # the disconnect response reaches the front before the process goes
        if transport.is_closing() or not transport.get_write_buffer_size():
            break
        await asyncio.sleep(0.01)
    return dispatcher


async def _read(reader: asyncio.StreamReader, dispatcher: Dispatcher) -> None:
    async for frame in channel.frames(reader):
        if isinstance(frame, channel.Request):
            dispatcher.accept(frame.message)


def _private_channel() -> tuple[int, int, int]:
    """Move the channel off fds 0 and 1: the program reads /dev/null and prints into a pipe of ours."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    output_r, output_w = os.pipe()
    os.dup2(output_w, 1)
    os.close(output_w)
    sys.stdout.reconfigure(line_buffering=True)  # sys.stdout writes to fd 1: the program's prints arrive promptly
    return fd_in, fd_out, output_r


class RankAdapterEngine(RankEngine):
    """One rank of a session of many: moved by the coordinator, and answering DAP requests about its own rank
    (`dap` messages) with the usual handlers over its own Session; what they say goes back as the rank's notes."""

    def __init__(self, rank: int, world_size: int):
        self.adapter = Adapter(self._emit, session_kind=FencedSession)
        self.adapter.variables = RankVariables(rank)  # a value's location names this rank
        super().__init__(rank, world_size, session=self.adapter.session)

    def _emit(self, event: str, body: dict | None = None) -> None:
        if event == "output" and body:  # a stop is the coordinator's to tell, for every rank at once
            self._event(Output(str(body.get("output", ""))))

    def launch(self, options: dict) -> dict:
        result = super().launch(options)
        self.adapter.launched = True
        return result

    def do_hello(self, m: dict) -> None:
        """The client's numbering of lines and columns (from its initialize)."""
        self.adapter.client.lines_start_at_1 = bool(m["linesStartAt1"])
        self.adapter.client.columns_start_at_1 = bool(m["columnsStartAt1"])

    def do_dap(self, m: dict) -> object:
        handler = REQUESTS.get(str(m.get("command")))
        if handler is None:
            raise RewindError(f"unknown request '{m.get('command')}'")
        return self.reading(f"'{handler.command}'", lambda: handler.fn(self.adapter, handler.parse(m.get("arguments"))))

    def do_motion(self, m: dict) -> dict:
        self.adapter.variables.clear()  # references live for one stop, here as in the adapter
        return super().do_motion(m)

    def do_goto(self, m: dict) -> dict:
        self.adapter.variables.clear()
        return super().do_goto(m)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dap_server.engine",
                                     description="One Rewind debug session; started by the DAP server, not by hand.")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--rank-launcher", type=int, metavar="FD")  # be the launcher of a session's ranks
    parser.add_argument("--join", metavar="HOST:PORT", help="be a rank started by torchrun (RANK, WORLD_SIZE) that "
                        "joins a debug session's coordinator listening there (docs/ranks.md, 'Several hosts')")
    args = parser.parse_args(argv)
    if args.join is not None:
        join_as_rank(args.join, RankAdapterEngine)
    if args.rank_launcher is not None:
        serve_ranks(lambda rank, world_size, store, pipe: run_rank(RankAdapterEngine(rank, world_size), store, pipe),
                    args.rank_launcher)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="rewind-engine %(levelname)s: %(message)s")
    fd_in, fd_out, output_fd = _private_channel()
    paths.follow_session_cwd()  # this process is one session's: its program runs in the launch's `cwd`
    dispatcher = asyncio.run(serve(fd_in, fd_out, output_fd))
    # The session closes on its worker (a recording is finished and renamed into place). A worker stuck in the
    # user's code must not keep the process alive: wait a while, then leave without running exit handlers.
    finished = threading.Thread(target=dispatcher.adapter.worker.shutdown, daemon=True)
    finished.start()
    finished.join(WORKER_GRACE_S)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
