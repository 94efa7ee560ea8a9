"""DAP server benchmark: request round trips, the first page of a 256 MiB tensor, a full stepBack, and what
the engine process costs a round trip.

Everything goes through the wire: `python -m dap_server` over stdio, driven by the same client
the console uses. Ratios are measured side by side in one run. The split of the server into a front
and an engine process is measured against `--in-process` (the engine inside the server), alternating
the two in rounds. Usage:
    python benchmarks/dap.py [--round-trips 2000] [--steps 200] [--split-rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dap_server.client import DapClient  # noqa: E402

GPT = ROOT / "examples" / "gpt.py"
BIG = ROOT / "benchmarks" / "big_tensor.py"
TARGET_FIRST_PAGE_MS = 50.0


def launch(program: Path, line_text: str | None = None, server_args: list[str] | None = None,
           **options) -> DapClient:
    """A server with `program` loaded, stopped at the first line containing `line_text` (or on entry)."""
    client = DapClient.spawn(server_args)
    client.request("initialize", {"adapterID": "rewind"})
    mark = client.mark()
    client.request("launch", {"program": str(program), "driver": "torch:cpu", "stopOnEntry": line_text is None,
                              **options})
    client.wait_for("initialized", after=mark)
    if line_text:
        line = next(i + 1 for i, text in enumerate(program.read_text().splitlines()) if line_text in text)
        client.request("setBreakpoints", {"source": {"path": str(program)}, "breakpoints": [{"line": line}]})
    client.request("configurationDone")
    client.wait_for("stopped", after=mark)
    return client


def round_trips_per_second(client: DapClient, command: str, arguments: dict | None, n: int) -> float:
    for _ in range(20):  # warm up
        client.request(command, arguments)
    started = time.perf_counter()
    for _ in range(n):
        client.request(command, arguments)
    return n / (time.perf_counter() - started)


def motion_ms(client: DapClient, command: str, arguments: dict) -> tuple[float, str]:
    mark = client.mark()
    started = time.perf_counter()
    client.request(command, arguments)
    stop = client.wait_for("stopped", after=mark)
    return (time.perf_counter() - started) * 1e3, stop["reason"]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def bench_requests(n: int) -> dict:
    client = launch(GPT, "mask = torch.ones")
    try:
        threads = round_trips_per_second(client, "threads", None, n)
        stack = round_trips_per_second(client, "stackTrace", {"threadId": 1}, n)
    finally:
        client.request("disconnect")
        client.close()
    return {"threads": threads, "stackTrace": stack}


def bench_first_page(repeats: int) -> dict:
    client = launch(BIG, "total = big.sum", checkpoint={"budgetMB": 2048})
    try:
        cold, warm_scope, warm_page = None, [], []
        for i in range(repeats):
            started = time.perf_counter()
            scopes = client.request("scopes", {"frameId": 1})["scopes"]
            local_ref = next(s["variablesReference"] for s in scopes if s["name"] == "Locals")
            big = next(v for v in client.request("variables", {"variablesReference": local_ref})["variables"]
                       if v["name"] == "big")
            middle = time.perf_counter()
            page = client.request("variables", {"variablesReference": big["variablesReference"],
                                                "filter": "indexed", "start": 0, "count": 100})["variables"]
            done = time.perf_counter()
            assert len(page) == 100 and big["value"].startswith("float32[8192, 8192]"), big["value"]
            if i == 0:
                cold = (done - started) * 1e3
            else:
                warm_scope.append((middle - started) * 1e3)
                warm_page.append((done - middle) * 1e3)
    finally:
        client.request("disconnect")
        client.close()
    return {"cold": cold, "scope": statistics.median(warm_scope), "page": statistics.median(warm_page),
            "total": statistics.median(a + b for a, b in zip(warm_scope, warm_page))}


def bench_split(rounds: int, n: int, steps: int) -> dict:
    """Round trips of `stackTrace` and `stepBack` with the engine in its own process and inside the server,
    alternating the two in each round; medians over the rounds (ms per round trip)."""
    found: dict[str, dict[str, list[float]]] = {mode: {"stackTrace": [], "stepBack": []}
                                                 for mode in ("process", "in-process")}
    for _ in range(rounds):
        for mode, args in (("process", []), ("in-process", ["--in-process"])):
            client = launch(GPT, server_args=args)
            try:
                found[mode]["stackTrace"].append(1e3 / round_trips_per_second(client, "stackTrace",
                                                                              {"threadId": 1}, n))
                for _ in range(steps):  # forward first, so that there is somewhere to go back from
                    motion_ms(client, "next", {"threadId": 1})
                back = [motion_ms(client, "stepBack", {"threadId": 1})[0] for _ in range(steps)]
                found[mode]["stepBack"].append(statistics.median(back))
            finally:
                client.request("disconnect")
                client.close()
    return {mode: {k: statistics.median(v) for k, v in kinds.items()} for mode, kinds in found.items()}


def bench_stepping(samples: int) -> dict:
    client = launch(GPT)
    back: list[float] = []
    forward: list[float] = []
    try:
        while len(back) < samples:
            while True:  # forward, line by line, to the end
                ms, reason = motion_ms(client, "next", {"threadId": 1})
                forward.append(ms)
                if reason == "end":
                    break
            while len(back) < samples:  # and back, line by line, to the start
                ms, reason = motion_ms(client, "stepBack", {"threadId": 1})
                back.append(ms)
                if reason == "entry":
                    break
    finally:
        client.request("disconnect")
        client.close()
    return {"back_p50": percentile(back, 50), "back_p95": percentile(back, 95),
            "next_p50": percentile(forward, 50), "next_p95": percentile(forward, 95),
            "n_back": len(back), "n_next": len(forward)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--page-repeats", type=int, default=11)
    ap.add_argument("--split-rounds", type=int, default=3)
    args = ap.parse_args()

    split = bench_split(args.split_rounds, args.round_trips // 4, 20)

    rt = bench_requests(args.round_trips)
    page = bench_first_page(args.page_repeats)
    steps = bench_stepping(args.steps)

    print("| measure | figure |")
    print("|---|---|")
    print(f"| `threads` round trips | {rt['threads']:.0f}/s (answered on the event loop) |")
    print(f"| `stackTrace` round trips | {rt['stackTrace']:.0f}/s (through the session worker): "
          f"{rt['stackTrace'] / rt['threads']:.2f}x the rate of `threads` |")
    print(f"| first page of `variables`, 256 MiB tensor | {page['page']:.1f} ms for 100 rows of 8192 "
          f"({page['page'] / TARGET_FIRST_PAGE_MS:.2f}x the 50 ms target); scope listing with its stats "
          f"{page['scope']:.1f} ms; both {page['total']:.1f} ms; first time (cold) {page['cold']:.1f} ms |")
    print(f"| `stepBack` round trip, examples/gpt.py | p50 {steps['back_p50']:.1f} ms, p95 {steps['back_p95']:.1f} ms "
          f"({steps['n_back']} steps); `next` p50 {steps['next_p50']:.1f} ms, p95 {steps['next_p95']:.1f} ms "
          f"({steps['n_next']} steps): back/forward p50 ratio {steps['back_p50'] / steps['next_p50']:.2f} |")
    for kind in ("stackTrace", "stepBack"):
        process, inside = split["process"][kind], split["in-process"][kind]
        print(f"| `{kind}` round trip, engine process vs in the server | {process:.3f} ms vs {inside:.3f} ms: "
              f"the split costs {process - inside:+.3f} ms ({process / inside:.2f}x; budget +0.3 ms) |")


if __name__ == "__main__":
    main()
