"""Slow clients against the recall service: does ``/healthz`` stay fast while many connections
drip their headers, and when are the drips cut?

    python -m eval.bench.bench_drip [--drips 200] [--probes 100]

Starts ``memsifter serve`` as its own process (coarse-only, SQLite, default limits: a 30 s
request deadline, 1,000 connections), opens ``--drips`` connections that each send a request
line and then one header line every 5 s, times ``--probes`` sequential ``GET /healthz`` calls
on fresh connections while they hang on, then waits for the server to cut the drips and
records when each was closed (and with what). Writes
``eval/results/bench_drip/bench_drip.{md,json}``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Annotated, Any

import typer

from eval.common import (
    Server,
    free_port,
    machine,
    machine_line,
    new_key,
    results,
    summarize,
    workspace,
    write_config,
)


def drip(port: int, every_s: float, out: list[dict[str, Any]], t0: float) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: bench\r\n")
    sock.settimeout(every_s)
    got = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    sock.close()
    out.append(
        {"closed_after_s": time.monotonic() - t0, "status": got[:12].decode(errors="replace")}
    )


def main(
    drips: Annotated[int, typer.Option(help="slow connections held open")] = 200,
    probes: Annotated[int, typer.Option(help="sequential GET /healthz while they hang on")] = 100,
    every_s: Annotated[float, typer.Option(help="seconds between dripped lines")] = 5.0,
) -> None:
    """Slow clients that drip a request line by line against the server's cut-off."""

    import httpx

    facts = machine()  # at the start of the run (its load average)
    with workspace() as tmp:
        config = tmp / "serve.yaml"
        write_config(config, f"sqlite:///{tmp / 'bench.db'}")
        server = Server(config=config, port=free_port(), key=new_key(), log=tmp / "serve.log")
        server.start()
        try:
            closed: list[dict[str, Any]] = []
            t0 = time.monotonic()
            threads = [
                threading.Thread(target=drip, args=(server.port, every_s, closed, t0))
                for _ in range(drips)
            ]
            for t in threads:
                t.start()
            time.sleep(1.0)  # every drip has connected and sent its first line
            latencies = []
            for _ in range(probes):
                s = time.perf_counter()
                r = httpx.get(f"{server.base_url}/healthz", timeout=10)
                latencies.append((time.perf_counter() - s) * 1000)
                assert r.status_code == 200, r.text
            for t in threads:
                t.join(120)
        finally:
            server.stop()
    cut = sorted(c["closed_after_s"] for c in closed)
    result = {
        "drips": drips,
        "every_s": every_s,
        "healthz_ms": summarize(latencies),
        "drips_closed": len(cut),
        "closed_after_s": {"min": round(cut[0], 2), "max": round(cut[-1], 2)} if cut else None,
        "closed_with": sorted({c["status"] for c in closed}),
        "machine": facts,
    }
    (results("bench_drip") / "bench_drip.json").write_text(json.dumps(result, indent=1) + "\n")
    h = result["healthz_ms"]
    lines = [
        "# Slow clients: /healthz while connections drip their headers",
        "",
        f"`python -m eval.bench.bench_drip --drips {drips} --probes {probes}` "
        f"({machine_line(facts, run=True)}). `memsifter serve` (coarse-only, SQLite, "
        "default limits: `limits.request_deadline_s` 30 s, `limits.max_connections` 1,000) "
        "as its own process; "
        f"{drips} connections each send a request line, then a header line every "
        f"{every_s:g} s; {probes} sequential `GET /healthz` on fresh connections "
        "meanwhile. Client and server share the cores.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| /healthz p50 ms | {h['p50_ms']} |",
        f"| /healthz p99 ms | {h['p99_ms']} |",
        f"| /healthz max ms | {h['max_ms']} |",
        f"| drips closed by the server | {len(cut)} of {drips} |",
        f"| closed after (s from their start) | {cut[0]:.1f} - {cut[-1]:.1f} |"
        if cut
        else "| closed after | - |",
        f"| answered with | {', '.join(result['closed_with'])} |",
        "",
    ]
    (results("bench_drip") / "bench_drip.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    typer.run(main)
