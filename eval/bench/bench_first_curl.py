"""The README's first curl with the shipped proxy: how long `recall` takes when the trained
adapter (memsifter-smollm2-135m-locomo) ranks, on the transformers backend
(configs/serve/trained_proxy.yaml) and on llama.cpp (configs/serve/llamacpp_proxy.yaml).

For each engine: start what it needs (llama-server for llama.cpp, through
memsifter.llm.llamacpp), start `memsifter serve --config ... --seed-sample` as its own process on
a throwaway SQLite file, and time the curl the service prints (`What is my dog called?`, top 2)
the first time and then --repeats more times. Committed as
eval/results/bench_first_curl/bench_first_curl.md.

    python -m eval.bench.bench_first_curl [--threads 2] [--repeats 9]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml

from eval.common import RESULTS
from memsifter.llm.llamacpp import launch_llamacpp_server
from memsifter.llm.local_server import free_port
from memsifter.machine import cpu_model, memory_gib
from memsifter.testing.server import printed_key, wait_ready

REPO = Path(__file__).resolve().parents[2]
PROXY = "memsifter-smollm2-135m-locomo"
CONFIGS = {
    "transformers": REPO / "configs/serve/trained_proxy.yaml",
    "llamacpp": REPO / "configs/serve/llamacpp_proxy.yaml",
    # The first-token head (one prefill, no decode); eval/bench/bench_head_latency.py runs it.
    "first_token": REPO / "configs/serve/first_token_proxy.yaml",
}
LLAMACPP_URL = "http://127.0.0.1:8012/v1"  # what llamacpp_proxy.yaml names


@contextlib.contextmanager
def engine_url(engine: str, threads: int) -> Iterator[str | None]:
    if engine == "llamacpp":
        with launch_llamacpp_server(PROXY, threads=threads, timeout=300) as url:
            yield url
    else:
        yield None


def first_curls(
    engine: str, threads: int, repeats: int, tmp: Path, dtype: str | None = None
) -> dict[str, Any]:
    """``dtype``: the in-process proxy's weights (``proxy.dtype``), set in the config's proxy
    block; None keeps the config's."""
    with engine_url(engine, threads) as url:
        text = CONFIGS[engine].read_text()
        if url is not None:
            text = text.replace(LLAMACPP_URL, url)
        if dtype is not None:
            raw = yaml.safe_load(text)
            if (raw.get("proxy") or {}).get("backend") != "transformers":
                raise RuntimeError(f"{CONFIGS[engine].name}: no transformers proxy block")
            raw["proxy"]["dtype"] = dtype
            text = yaml.safe_dump(raw, sort_keys=False)
        config = tmp / f"{engine}.yaml"
        config.write_text(text)
        port = free_port()
        env = dict(os.environ)
        env.pop("MEMSIFTER_DEMO_KEY", None)  # generated and printed, as on a fresh clone
        env |= {
            "MEMSIFTER_SERVE_DB_URL": f"sqlite:///{tmp / f'{engine}.db'}",
            "OMP_NUM_THREADS": str(threads),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        cmd = [sys.executable, "-m", "memsifter.cli", "serve", "--config", str(config)]
        cmd += ["--port", str(port), "--seed-sample"]
        log = tmp / f"{engine}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            t_start = time.monotonic()
            key = printed_key(wait_ready(proc, port, log))
            ready_s = time.monotonic() - t_start
            times, body = [], {}
            for _ in range(1 + repeats):
                t0 = time.monotonic()
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/users/alice/recall",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"question": "What is my dog called?", "top_k": 2},
                    timeout=120,
                )
                times.append(time.monotonic() - t0)
                r.raise_for_status()
                body = r.json()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if not str(body.get("ranker", "")).startswith("proxy:"):
        raise RuntimeError(
            f"{CONFIGS[engine].name} answered with ranker {body.get('ranker')!r}, not the proxy"
        )
    rest = sorted(times[1:])
    return {
        "ready_s": ready_s,
        "first_s": times[0],
        "repeat_median_s": rest[len(rest) // 2] if rest else None,
        "repeat_max_s": rest[-1] if rest else None,
        "ranker": body.get("ranker"),
        "top_hit": (body.get("hits") or [{}])[0].get("text", "")[:80],
    }


def main(
    threads: Annotated[int, typer.Option(help="threads of the service and of llama-server")] = 2,
    repeats: Annotated[int, typer.Option(help="curls after the first")] = 9,
    engines: Annotated[str, typer.Option()] = "transformers,llamacpp",
    out: Annotated[Path, typer.Option()] = RESULTS / "bench_first_curl" / "bench_first_curl.md",
) -> None:
    names = [e.strip() for e in engines.split(",") if e.strip()]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="memsifter-first-curl-") as tmp:
        rows = {name: first_curls(name, threads, repeats, Path(tmp)) for name in names}
    load_after = os.getloadavg()
    for row in rows.values():
        typer.echo(row, err=True)
    cmd = "python -m eval.bench.bench_first_curl"
    if threads != 2:
        cmd += f" --threads {threads}"
    lines = [
        f"# The README's first curl with the shipped proxy ({PROXY})",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, {memory_gib()} GiB; {threads} "
        f"thread(s) for the service and for llama-server; {date.today().isoformat()}. Command: "
        f"`{cmd}`. Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after.",
        "",
        "Each engine: `memsifter serve --config <config> --seed-sample` on a fresh SQLite file, "
        "then the curl it prints (`What is my dog called?`, top 2) once, then "
        f"{repeats} more times. `ready`: from starting the service to `/readyz` (the model load; "
        "llama-server was started and loaded before it).",
        "",
        "| engine | config | ready s | first curl s | next curls: median s | max s | ranker |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {name} | `{CONFIGS[name].relative_to(REPO)}` | {r['ready_s']:.1f} | "
            f"{r['first_s']:.2f} | {r['repeat_median_s']:.2f} | {r['repeat_max_s']:.2f} | "
            f"{r['ranker']} |"
            for name, r in rows.items()
        ],
        "",
        "Goal: the first curl with the shipped proxy in <= 3 s on 2 cores.",
        "",
    ]
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(
        json.dumps(
            {"threads": threads, "loadavg_1min": [load_before[0], load_after[0]], "rows": rows},
            indent=2,
        )
    )
    typer.echo(out.read_text())


if __name__ == "__main__":
    typer.run(main)
