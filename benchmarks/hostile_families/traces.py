"""traces: a recorded trace of hostile.py build, damaged, then launched and debugged over TCP.

The damage: truncated at every frame boundary and at seeded offsets, bits flipped (with and without the CRC
fixed), wrong magic, version and flags, footers and index entries pointing anywhere, frames claiming gigabytes,
and frames rewritten with crafted fields of every kind (program, meta, step, write, initial, version,
checkpoint, truncate; CRCs correct): compression bombs, huge shapes, odd dtypes, op names reaching
torch.ops.import_module / load_library with the marker module or library, deep msgpack.

Handled: the launch is refused with a message, or the trace opens and configurationDone, continue, stepBack,
stackTrace, scopes, variables, evaluate, firstDivergence and compareWithReference are all answered, then
`threads`. Code executed: a marker file appeared (the marker module imported or the library loaded). Crash,
hang and leak as everywhere.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import lz4.block
import msgpack

from checkpoint import trace as tracefile

from .common import HOSTILE, INITIALIZE, MARKER_MODULE, Check, Crash, Family, Hang, Server, SetupError, Wire, \
    goodbye, initialize, launch_program, nested, preview, wait_until

TITLE = "damaged traces"
BUDGET_S = (170, 35)  # (default, --quick) seconds
H = tracefile.HEADER
F = tracefile.FRAME
FOOT = tracefile.FOOTER
KIND = {"meta": 1, "program": 2, "initial": 3, "step": 4, "write": 5, "version": 6, "checkpoint": 7, "truncate": 8,
        "index": 9}
Cases = list[tuple[str, Any]]  # (label, frames, or (frames, extra launch arguments))


# -- the trace format, read and written back ------------------------------------------------------------------
class RawBody(bytes):
    """A frame payload given as bytes, not packed again."""


def parse_trace(data: bytes) -> tuple[list[list], list[int]]:
    """[[kind, payload object], ...] without the index, and the offset where each frame (and the index) begins."""
    frames, offsets = [], []
    offset = H.size
    while offset + F.size <= len(data):
        length, _, kind = F.unpack_from(data, offset)
        if offset + F.size + length > len(data):
            break
        offsets.append(offset)
        if kind != KIND["index"]:
            frames.append([kind, msgpack.unpackb(data[offset + F.size: offset + F.size + length], raw=False,
                                                 strict_map_key=False)])
        offset += F.size + length
    return frames, offsets


def pack_frame(kind: int, payload: Any, crc: bool = True) -> bytes:
    blob = bytes(payload) if isinstance(payload, RawBody) else msgpack.packb(payload, use_bin_type=True)
    return F.pack(len(blob), zlib.crc32(bytes([kind]) + blob) if crc else 0, kind) + blob


def index_key(kind: int, payload: Any) -> list:
    if kind in (KIND["initial"], KIND["version"]) and isinstance(payload, dict):
        key = [payload.get("name")]
        if kind == KIND["version"]:
            key.append(payload.get("tick"))
        return key
    return []


def build_trace(frames: list[list], index: bool = True, header: bytes | None = None,
                index_entries: Any = None, footer_offset: int | None = None) -> bytes:
    out = bytearray(header if header is not None else H.pack(tracefile.MAGIC, tracefile.VERSION, 0))
    entries = []
    for kind, payload in frames:
        entries.append([kind, len(out), *index_key(kind, payload)])
        out += pack_frame(kind, payload)
    if index:
        at = len(out)
        out += pack_frame(KIND["index"], entries if index_entries is None else index_entries)
        out += FOOT.pack(at if footer_offset is None else footer_offset, tracefile.FOOTER_MAGIC)
    return bytes(out)


def edit(frames: list[list], kind: str, fn: Callable[[Any], Any], which: int = 0) -> list[list]:
    """A deep copy of `frames` whose `which`-th frame of `kind` has its payload replaced by fn(payload)."""
    out = copy.deepcopy(frames)
    seen = 0
    for item in out:
        if item[0] == KIND[kind]:
            if seen == which:
                item[1] = fn(item[1])
                return out
            seen += 1
    return out


def setitem(obj: Any, path: list, value: Any) -> Any:
    target = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


def deep_msgpack(depth: int) -> RawBody:
    return RawBody(b"\x91" * depth + b"\xc0")  # fixarray of one, nested `depth` times, around nil


def without(frames: list[list], kind: str) -> list[list]:
    return [f for f in frames if f[0] != KIND[kind]]


# -- crafted damage: fields of every frame kind rewritten (CRCs correct) -------------------------------------------
ESCAPING_OPS = ["import_module.__call__.__call__", "load_library.__call__.__call__", "ops.import_module.default",
                "import_module.default.default", "aten.import_module.default", "builtins.exec.default",
                "os.system.default", "posix.system.default", "aten.linear.__call__", "aten.__class__.default",
                "aten.linear.default.extra", "aten", "", "torch.ops.aten", "_ops.import_module.default",
                "higher_order.cond.default", "loaded_libraries.x.y", "aten.name.default", "aten._dir.default",
                "aten.linear.__init__", 7, ["aten", "linear"], {"$ref": "x"}]


def op_name_cases(frames: list[list], markers_module: str, so: str | None) -> Cases:
    """Op names that try to reach torch.ops' own methods, or other callables (stored and recomputed values)."""
    cases: Cases = []
    for op in ESCAPING_OPS:
        for arg in ([markers_module], [so or "/nonexistent/libmarker.so"]):
            program = lambda p, op=op, arg=arg: setitem(setitem(p, ["nodes", 0, "op"], op), ["nodes", 0, "args"],
                                                        {"$tuple": arg})
            label = f"op {preview(op, 50)} with args {preview(arg, 60)}"
            cases.append((label, edit(frames, "program", program)))
            cases.append((label + ", no stored values (recomputed with torch:cpu)",
                          (without(edit(frames, "program", program), "version"), {"driver": "torch:cpu"})))
            if op not in ("import_module.__call__.__call__", "load_library.__call__.__call__"):
                break
    return cases


def program_cases(frames: list[list]) -> Cases:
    fields = [
        ("program: nodes not a list", ["nodes"], "nodes"), ("program: no nodes", ["nodes"], []),
        ("program: node a string", ["nodes", 0], "linear"),
        ("program: output index -1", ["nodes", 0, "output_indices"], [-1]),
        ("program: output index 2**63", ["nodes", 0, "output_indices"], [2**63 - 1]),
        ("program: outputs wrong type", ["nodes", 0, "outputs"], 5),
        ("program: loc line 2**40", ["nodes", 0, "loc"], ["/x.py", 2**40, "f"]),
        ("program: loc of a NUL path", ["nodes", 0, "loc"], ["/x\x00y.py", 1, "f"]),
        ("program: args nested 500 deep", ["nodes", 0, "args"], nested(500)),
        ("program: args a $dtype bomb", ["nodes", 0, "args"], {"$tuple": [{"$dtype": "object"}]}),
        ("program: args $device cuda:99", ["nodes", 0, "args"], {"$tuple": [{"$device": "cuda:99"}]}),
        ("program: args unknown tag", ["nodes", 0, "args"], {"$eval": "__import__('os')"}),
        ("program: kwargs not a $dict", ["nodes", 0, "kwargs"], {"out": {"$ref": "x"}}),
        ("program: a value of huge shape", ["values", 0, 3], [2**62, 2**62]),
        ("program: a value of negative shape", ["values", 0, 3], [-1, 4]),
        ("program: a value of dtype object", ["values", 0, 2], "object"),
        ("program: a value producer 10**9", ["values", -1, 4], 10**9),
        ("program: values a map", ["values"], {"x": 1}), ("program: outputs unknown", ["outputs"], ["nope"]),
        ("program: buffer mutation to nowhere", ["buffer_mutations"], {"mul": "nope"}),
        ("program: source_files of 10**5 entries", ["source_files"], {f"/f{i}.py": "x" for i in range(100_000)}),
        ("program: source_files not text", ["source_files"], {"/x.py": 5}),
        ("program: source path traversal", ["source_files"], {"../../../../etc/passwd": "root"}),
        ("program: name 10**6 chars", ["name"], "n" * 10**6),
        ("program: frames junk", ["nodes", 0, "frames"], [[None, 5, {}]]),
        ("program: module_stack junk", ["nodes", 0, "module_stack"], [[1, 2, 3, 4, 5]]),
    ]
    cases: Cases = [(label, edit(frames, "program", lambda p, path=path, value=value: setitem(p, path, value)))
                    for label, path, value in fields]
    return cases + [
        ("program: a list", edit(frames, "program", lambda p: [p])),
        ("program: nested 5000 deep (msgpack)", edit(frames, "program", lambda p: deep_msgpack(5000))),
        ("program: two program frames", frames[:2] + [frames[1]] + frames[2:]),
        ("program: missing", without(frames, "program")),
        ("program: after the steps", without(frames, "program") + [frames[1]])]


def meta_cases(frames: list[list]) -> Cases:
    edits = [("meta: units empty", lambda p: setitem(p, ["units"], [])),
             ("meta: 70000 units", lambda p: setitem(p, ["units"], ["u"] * 70_000)),
             ("meta: units not text", lambda p: setitem(p, ["units"], [1])),
             ("meta: driver 'torch:cuda:99'", lambda p: setitem(p, ["driver"], "torch:cuda:99")),
             ("meta: driver 10000 chars", lambda p: setitem(p, ["driver"], "d" * 10_000)),
             ("meta: location address -1", lambda p: setitem(p, ["initial_locations", "x", "address"], -1)),
             ("meta: location shape huge", lambda p: setitem(p, ["initial_locations", "x", "shape"], [2**40, 2**40])),
             ("meta: location strides 100", lambda p: setitem(p, ["initial_locations", "x", "strides"], [1] * 100)),
             ("meta: a list", lambda p: [p]), ("meta: nil", lambda p: None)]
    return [(label, edit(frames, "meta", fn)) for label, fn in edits]


def step_cases(frames: list[list]) -> Cases:
    steps = [("step: tick 2**63", [2**63, 0, 0, None]), ("step: tick -1", [-1, 0, 0, None]),
             ("step: tick a string", ["0", 0, 0, None]), ("step: node 2**64", [0, 0, 2**64 - 1, None]),
             ("step: node -1", [0, 0, -1, None]), ("step: unit 5", [0, 5, 0, None]),
             ("step: node and edit", [0, 0, 0, {"value": "linear"}]),
             ("step: edit offset -1", [0, 0, None, {"value": "linear", "offset": -1, "data": b"x"}]),
             ("step: edit offset 2**63", [0, 0, None, {"value": "linear", "offset": 2**63, "data": b"x"}]),
             ("step: edit of 10 MB", [0, 0, None, {"value": "linear", "offset": 0, "data": b"x" * 10**7}]),
             ("step: edit of an unknown value", [0, 0, None, {"value": "nope", "offset": 0, "data": b""}]),
             ("step: five fields", [0, 0, 0, None, 1]), ("step: a map", {"tick": 0}),
             ("step: nested", nested(200))]
    cases: Cases = [(label, edit(frames, "step", lambda p, value=value: value)) for label, value in steps]
    return cases + [("step: the same step twice", edit(frames, "step", lambda p: [0, 0, 0, None], which=1)),
                    ("step: nodes out of order", edit(frames, "step", lambda p: [1, 0, 0, None], which=1))]


def write_cases(frames: list[list]) -> Cases:
    fields = [("write: nbytes 2**63", 7, 2**63), ("write: address -1", 6, -1), ("write: value unknown", 3, "nope"),
              ("write: kind 99", 4, 99), ("write: min a string", 11, "x"), ("write: mean nested", 13, nested(100)),
              ("write: digest 2**64-1", 8, 2**64 - 1), ("write: unit 10**6 chars", 1, "u" * 10**6),
              ("write: tick wrong", 0, 5)]
    cases: Cases = [(label, edit(frames, "write", lambda p, index=index, value=value: setitem(p, [index], value)))
                    for label, index, value in fields]
    return cases + [("write: 13 fields", edit(frames, "write", lambda p: p[:13]))]


def tensor(dtype: str, shape: list, nbytes: int, lz4: Any, data: Any = None) -> dict:
    """A stored tensor record; `data` None leaves the field out."""
    record = {"dtype": dtype, "shape": shape, "nbytes": nbytes, "lz4": lz4}
    return record if data is None else {**record, "data": data}


def tensor_cases(frames: list[list]) -> Cases:
    """VERSION / INITIAL tensors: compression bombs and crafted records."""
    big_zero = lz4.block.compress(b"\x00" * (64 * 2**20), store_size=False)
    records = [
        ("nbytes 2**40, shape 2**20 x 2**20, 10 bytes", tensor("float32", [2**20, 2**20], 2**40, True, b"\x00" * 10)),
        ("256 MiB declared, 10 bytes of lz4", tensor("float32", [2**26], 2**28, True, b"\x00" * 10)),
        ("a real lz4 bomb: 64 MiB of zeros", tensor("float32", [2**24], 2**26, True, big_zero)),
        ("lz4 data corrupt", tensor("float32", [2, 4], 32, True, b"\xff" * 20)),
        ("nbytes 0, data present", tensor("float32", [0], 0, True, b"abc")),
        ("dtype object", tensor("object", [2, 4], 32, False, b"\x00" * 32)),
        ("dtype __class__", tensor("__class__", [2, 4], 32, False, b"\x00" * 32)),
        ("dtype qint8", tensor("qint8", [2, 4], 8, False, b"\x00" * 8)),
        ("shape -1", tensor("float32", [-1, 8], 32, False, b"\x00" * 32)),
        ("shape 100 dims", tensor("float32", [1] * 100, 4, False, b"\x00" * 4)),
        ("shape 2**63", tensor("float32", [2**63], 2**63, False, b"")),
        ("data a string", tensor("float32", [2, 4], 32, False, "x" * 32)),
        ("lz4 'yes'", tensor("float32", [2, 4], 32, "yes", b"\x00" * 32)),
        ("no data", tensor("float32", [2, 4], 32, False)),
        ("tensor nested", nested(300)),
    ]
    cases: Cases = []
    for label, record in records:
        cases.append((f"initial x: {label}", edit(frames, "initial", lambda p, t=record: setitem(p, ["tensor"], t),
                                                  which=2)))
        cases.append((f"version linear: {label}", edit(frames, "version",
                                                       lambda p, t=record: setitem(p, ["tensor"], t))))
    for label, key, value in [("version: name unknown", "name", "nope"), ("version: tick -1", "tick", -1),
                              ("version: tick 2**63", "tick", 2**63), ("version: name not text", "name", ["x"])]:
        cases.append((label, edit(frames, "version", lambda p, key=key, value=value: setitem(p, [key], value))))
    return cases + [("initial: name unknown", edit(frames, "initial", lambda p: setitem(p, ["name"], "nope"))),
                    ("initial: a second x", frames + [next(f for f in frames if f[0] == KIND["initial"])])]


def checkpoint_cases(frames: list[list]) -> Cases:
    """CHECKPOINT / TRUNCATE."""
    checkpoints = [("checkpoint: pin tick -5", [2, [["relu", -5]]]),
                   ("checkpoint: pin tick 2**63", [2, [["relu", 2**63]]]), ("checkpoint: tick 10**9", [10**9, []]),
                   ("checkpoint: pins junk", [2, "pins"]), ("checkpoint: 10**5 pins", [2, [["relu", 1]] * 100_000])]
    cases: Cases = [(label, edit(frames, "checkpoint", lambda p, value=value: value)) for label, value in checkpoints]
    return cases + [(f"truncate: {preview(value)}", frames + [[KIND["truncate"], value]])
                    for value in [-1, 2**63, "x", None, 0]]


def frame_level_cases(frames: list[list]) -> Cases:
    """Raw payloads with correct CRCs."""
    return [
        ("a frame of unknown kind 10", frames[:3] + [[10, {"x": 1}]] + frames[3:]),
        ("a frame of kind 0", frames[:3] + [[0, {"x": 1}]] + frames[3:]),
        ("invalid msgpack", edit(frames, "step", lambda p: RawBody(b"\xc1\xc1\xc1"))),
        ("msgpack with trailing bytes", edit(frames, "step", lambda p: RawBody(msgpack.packb(p) + b"\x00\x01"))),
        ("msgpack array claiming 2**32-1 items", edit(frames, "step", lambda p: RawBody(b"\xdd\xff\xff\xff\xff"))),
        ("msgpack map claiming 2**32-1 pairs", edit(frames, "meta", lambda p: RawBody(b"\xdf\xff\xff\xff\xff"))),
        ("msgpack str claiming 4 GiB", edit(frames, "meta", lambda p: RawBody(b"\xdb\xff\xff\xff\xff"))),
        ("msgpack ext type (timestamp)", edit(frames, "step", lambda p: RawBody(b"\xd6\xff\x00\x00\x00\x01"))),
        ("msgpack map with a list key", edit(frames, "meta", lambda p: RawBody(b"\x81\x91\x01\x01"))),
        ("msgpack map with an int key", edit(frames, "meta", lambda p: {1: 2, **p})),
        ("step nested 100000 deep (msgpack)", edit(frames, "step", lambda p: deep_msgpack(100_000))),
    ]


def crafted_traces(frames: list[list], markers_module: str, so: str | None) -> Cases:
    """(label, frames or (frames, extra launch arguments)) for every crafted damage."""
    return (op_name_cases(frames, markers_module, so) + program_cases(frames) + meta_cases(frames)
            + step_cases(frames) + write_cases(frames) + tensor_cases(frames) + checkpoint_cases(frames)
            + frame_level_cases(frames))


# -- damaged bytes ---------------------------------------------------------------------------------------------
def truncations(base: bytes, offsets: list[int], fam: Family) -> list[tuple[str, bytes, dict]]:
    ends = offsets[1:] + [len(base) - FOOT.size]  # where each frame ends
    out = []
    for at in sorted({0, 8, H.size, *offsets, *ends, len(base) - FOOT.size, len(base) - 8, len(base) - 1}):
        out.append((f"truncated at {at} (frame boundary)" if at in offsets or at in ends else f"truncated at {at}",
                    base[:at], {}))
    for _ in range(fam.n(10, 3)):
        at = fam.rng.randrange(1, len(base))
        out.append((f"truncated at random offset {at}", base[:at], {}))
    return out


def bit_flips(base: bytes, frames: list[list], fam: Family) -> list[tuple[str, bytes, dict]]:
    rng, out = fam.rng, []
    for _ in range(fam.n(15, 4)):
        data = bytearray(base)
        spots = [rng.randrange(len(data)) for _ in range(rng.randint(1, 3))]
        for spot in spots:
            data[spot] ^= 1 << rng.randrange(8)
        out.append((f"bits flipped at {spots}", bytes(data), {}))
    for _ in range(fam.n(15, 4)):
        # flip inside one payload, then fix its CRC and rebuild the index: only the reader's field checks stand
        data = copy.deepcopy(frames)
        which = rng.randrange(len(data))
        blob = bytearray(msgpack.packb(data[which][1], use_bin_type=True))
        spot = rng.randrange(len(blob))
        blob[spot] ^= 1 << rng.randrange(8)
        data[which][1] = RawBody(bytes(blob))
        out.append((f"frame {which} (kind {data[which][0]}) bit flipped at payload byte {spot}, CRC fixed",
                    build_trace(data), {}))
    return out


def header_cases(base: bytes, offsets: list[int]) -> list[tuple[str, bytes, dict]]:
    """Header, footer and frame-length damage."""
    header = H.pack(tracefile.MAGIC, tracefile.VERSION, 0)

    def footer(offset: int) -> bytes:
        return base[:-16] + FOOT.pack(offset, tracefile.FOOTER_MAGIC)

    def claiming(length: int) -> bytes:
        return base[:offsets[2]] + F.pack(length, 0, 3) + base[offsets[2] + F.size:]

    cases = [("wrong magic", b"RWNDTRX\0" + base[8:]), ("version 2", H.pack(tracefile.MAGIC, 2, 0) + base[16:]),
             ("version 2**32-1", H.pack(tracefile.MAGIC, 2**32 - 1, 0) + base[16:]),
             ("flags set", H.pack(tracefile.MAGIC, 1, 0xFFFFFFFF) + base[16:]), ("empty file", b""),
             ("header only", header), ("header and footer", header + FOOT.pack(16, tracefile.FOOTER_MAGIC)),
             ("footer points at itself", footer(len(base) - 16)), ("footer points at offset 0", footer(0)),
             ("footer points at 2**64-1", footer(2**64 - 1)),
             ("footer points at the program frame", footer(offsets[1])),
             ("a frame claiming 2**31 bytes", claiming(2**31)), ("a frame claiming 2**32-1 bytes", claiming(2**32 - 1)),
             ("a trace of 20 MB of zeros after the header", header + b"\x00" * (20 * 2**20))]
    return [(label, data, {}) for label, data in cases]


def index_cases(frames: list[list], offsets: list[int]) -> list[tuple[str, bytes, dict]]:
    entries = [("index: an entry of kind index", [[9, 16]]), ("index: offset -5", [[1, -5]]),
               ("index: offset 2**64", [[1, 2**64 - 1]]), ("index: key wrong", [[3, offsets[2], 5]]),
               ("index: a string", "index"), ("index: a map", {"a": 1}), ("index: nested", nested(200)),
               ("index: every entry 10000 times", [[1, 16]] * 10_000),
               ("index: entries point at each other's frames", [[2, 16], [1, offsets[1]], [3, offsets[3], "x"]])]
    return [(label, build_trace(frames, index_entries=value), {}) for label, value in entries]


def crafted_bytes(frames: list[list], fam: Family, so: str | None) -> list[tuple[str, bytes, dict]]:
    """The crafted traces written out, a quarter of them (seeded) also without their index."""
    out = []
    for label, value in crafted_traces(frames, MARKER_MODULE, so):
        extra = {}
        if isinstance(value, tuple):
            value, extra = value
        try:
            out.append((label, build_trace(value), extra))
            if fam.rng.random() < 0.25:
                out.append((label + " (no index)", build_trace(value, index=False), extra))
        except (ValueError, OverflowError, TypeError) as exc:  # msgpack cannot write it: no such file can exist
            fam.notes.append(f"crafted case '{label}' left out: msgpack cannot pack it ({exc})")
    return out


def trace_bytes_cases(base: bytes, frames: list[list], offsets: list[int], fam: Family,
                      so: str | None) -> list[tuple[str, bytes, dict]]:
    """(label, the damaged file's bytes, extra launch arguments) for every damage."""
    return (truncations(base, offsets, fam) + bit_flips(base, frames, fam) + header_cases(base, offsets)
            + index_cases(frames, offsets) + crafted_bytes(frames, fam, so))


# -- the run ---------------------------------------------------------------------------------------------------
class Pool:
    """Initialized connections to one TCP server, the next one prepared (its engine starting) while the current
    one works."""

    def __init__(self, family: Family, server: Server, size: int = 1):
        self.family, self.server = family, server
        self.ready: queue.Queue = queue.Queue()
        self.size = size
        for _ in range(size):
            self._prepare()

    def _prepare(self) -> None:
        threading.Thread(target=self._connect, daemon=True).start()

    def _connect(self) -> None:
        try:
            wire = self.server.connect()
            seq, _ = wire.send("initialize", INITIALIZE)
            response = wire.wait_response(seq, self.family.ctx.timeout * 2, "initialize")
            if not response.get("success"):
                raise SetupError(f"initialize refused: {response.get('message')}")
            self.ready.put(wire)
        except Exception as exc:  # noqa: BLE001 -- handed to the taker
            self.ready.put(exc)

    def take(self) -> Wire:
        try:
            item = self.ready.get(timeout=self.family.ctx.timeout * 3)
        except queue.Empty:
            raise SetupError("no initialized connection in time") from None
        self._prepare()
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        deadline = time.monotonic() + 10
        for _ in range(self.size):
            try:
                item = self.ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                return
            if isinstance(item, Wire):
                goodbye(item)


def record_base_trace(fam: Family, server: Server, target: Path) -> bytes:
    wire = server.connect()
    with fam.setup("setup: record a trace", f"launch hostile.py build with record {target}, continue, disconnect"
                   ) as chk:
        initialize(chk, wire)
        launch_program(chk, wire, HOSTILE, stop_on_entry=False, record=str(target))
        goodbye(wire)
        if not wait_until(lambda: target.exists() and target.read_bytes()[-8:] == tracefile.FOOTER_MAGIC, 30):
            raise SetupError(f"the recording {target} did not appear whole")
    return target.read_bytes()


def debug_trace(chk: Check, wire: Wire) -> None:
    """What a user does with an opened trace: run it, step back, look at values, compare with a reference."""
    chk.motion(wire, "configurationDone", {})
    chk.motion(wire, "continue")
    chk.motion(wire, "stepBack")
    stack = chk.request(wire, "stackTrace", {"threadId": 1})
    frames = (stack.get("body") or {}).get("stackFrames") or [{"id": 1}]
    scopes = chk.request(wire, "scopes", {"frameId": frames[0].get("id", 1)})
    for scope in ((scopes.get("body") or {}).get("scopes") or [])[:4]:
        chk.request(wire, "variables", {"variablesReference": scope.get("variablesReference", 0)})
    for name in ("x", "mul", "linear"):
        chk.request(wire, "evaluate", {"expression": name, "context": "repl", "frameId": frames[0].get("id", 1)})
    chk.request(wire, "firstDivergence", {})
    chk.request(wire, "compareWithReference", {"count": 8})


class Launches:
    """The damaged traces launched one by one on connections from a pool; one that opens uses its connection up."""

    def __init__(self, fam: Family, server: Server):
        self.fam, self.server = fam, server
        self.pool = Pool(fam, server, size=2)  # a trace that opens uses up its engine: the next ones start meanwhile
        self.wire: Wire | None = None
        self.opened = self.tried = 0

    def connection(self) -> Wire | None:
        for attempt in range(3):
            try:
                if self.wire is None:
                    self.wire = self.pool.take()
                break
            except (Crash, Hang, SetupError) as exc:
                tail = " | ".join(list(self.server.stderr_tail)[-3:])
                self.fam.setup_failed(f"a fresh connection, attempt {attempt + 1}",
                                      f"{exc} [server stderr: {tail[:300]}]")
        return self.wire

    def launch(self, wire: Wire, path: Path, label: str, extra: dict) -> None:
        launch = {"trace": str(path), **extra}
        repro = (f"TCP server (--stop-grace 1): launch {preview(launch)} where the file is the recording of "
                 f"hostile.py build (record, run to the end), damaged: {label}; then configurationDone, continue, "
                 f"stepBack, stackTrace, scopes, variables, evaluate, firstDivergence, compareWithReference, threads")
        used = False
        self.tried += 1
        with self.fam.check(label, repro) as chk:
            mark = wire.mark()
            if chk.request(wire, "launch", launch).get("success"):
                used = True
                self.opened += 1
                wire.wait_event(("initialized",), mark, chk.timeout)
                debug_trace(chk, wire)
            chk.threads(wire)
        if used or not chk.outcome.handled:
            goodbye(wire)
            self.wire = None

    def close(self) -> None:
        self.fam.notes.append(f"{self.opened} of {self.tried} damaged traces opened (debugged to the end); the rest "
                              "were refused at launch")
        if self.wire is not None:
            goodbye(self.wire)
        self.pool.close()


def run(fam: Family) -> None:
    folder = fam.ctx.sandbox / "traces"
    folder.mkdir()
    server = fam.tcp_server("server", "--stop-grace", "1")
    if server is None:
        return
    try:
        base = record_base_trace(fam, server, folder / "base.rwtrace")
        fam.ctx.base_trace = folder / "base.rwtrace"
    except (Crash, Hang, SetupError) as exc:
        fam.setup_failed("recording the trace to damage", exc)
        server.stop()
        return
    launch_all(fam, server, folder, base)
    server.stop()


def launch_all(fam: Family, server: Server, folder: Path, base: bytes) -> None:
    frames, offsets = parse_trace(base)
    cases = trace_bytes_cases(base, frames, offsets, fam, fam.ctx.marker_so)
    fam.rng.shuffle(cases)  # when the time budget cuts the list short, it cuts a sample of every kind of damage
    if fam.ctx.quick:
        cases = cases[:12]
    launches = Launches(fam, server)
    for i, (label, data, extra) in enumerate(cases):
        if fam.out_of_time():
            continue
        path = folder / f"case-{i:03d}.rwtrace"
        path.write_bytes(data)
        wire = launches.connection()
        if wire is None:
            break
        launches.launch(wire, path, label, extra)
        path.unlink(missing_ok=True)
    launches.close()
