"""``memsifter serve``: build the app from a config, optionally seed a sample, run uvicorn.

With ``--seed-sample`` the sample tenant's key comes from ``$MEMSIFTER_DEMO_KEY`` (the config's
``sample_key_env``) or, when that is unset, is generated and printed once: the store keeps only
its hash, so it cannot be shown again.

**Several workers** (``--workers N``): uvicorn starts N processes, each building its own app
from the config (:func:`worker_app`, handed the config path in ``$MEMSIFTER_SERVE_CONFIG``), and
restarts one that dies. The parent first migrates the database (so the workers do not race to)
and seeds the sample; metrics run in prometheus_client's multiprocess mode (see
``memsifter.serving.metrics``). What each worker keeps to itself: its user indexes and caches
(every replica catches up from the database's user versions, as separate replicas do) and its
rate limiter (a tenant's ``limits.rate_per_s`` applies per worker). Both databases are safe with
several workers: PostgreSQL locks the user row, and SQLite writes open with ``BEGIN IMMEDIATE``,
which waits for another process's writer up to ``busy_timeout``, on one machine's disk (SQLite's
locking does not hold over a network file system).
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from prometheus_client import multiprocess

from memsifter.serving.app import create_app
from memsifter.serving.config import ServeConfig, load_serve_config
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import configure_logging
from memsifter.serving.metrics import (
    multiprocess_dir,
    prepare_multiprocess_dir,
    remove_multiprocess_dir,
)
from memsifter.serving.sample import SAMPLE_USER, seed_sample
from memsifter.serving.store import Store, hash_key

CONFIG_ENV = "MEMSIFTER_SERVE_CONFIG"
LOG_LEVEL_ENV = "MEMSIFTER_LOG_LEVEL"


@dataclass(frozen=True)
class Prepared:
    app: FastAPI
    sample_key: str | None = None
    key_generated: bool = False


def prepare(config: ServeConfig, *, sample: bool = False) -> Prepared:
    if not sample:
        return Prepared(create_app(config))
    key = os.environ.get(config.sample_key_env)
    generated = not key
    if not key:
        key = "msk-" + secrets.token_urlsafe(24)
        # This process's own environment, so a config that bootstraps the same variable
        # creates this key instead of warning that it is unset.
        os.environ[config.sample_key_env] = key
    app = create_app(config)
    services = app.state.services
    if services.store.key_revoked(hash_key(key)):
        # Revocations outlive restarts; printing a curl with a dead key would only confuse.
        raise ServeError(
            f"the sample key in ${config.sample_key_env} was revoked; unset the variable to "
            "have a new key generated",
            field=config.sample_key_env,
        )
    services.store.add_api_key(config.sample_tenant, key=key)
    seed_sample(services.memory, config.sample_tenant)
    return Prepared(app, key, generated)


def first_curl(host: str, port: int, key: str) -> str:
    shown = "localhost" if host in ("0.0.0.0", "::") else host
    return (
        f"curl -s http://{shown}:{port}/v1/users/{SAMPLE_USER}/recall \\\n"
        f"  -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\\n"
        '  -d \'{"question": "What is my dog called?", "top_k": 2}\''
    )


def worker_app() -> FastAPI:
    """The app of one worker process (``--workers N``): the config named by the parent."""
    configure_logging(os.environ.get(LOG_LEVEL_ENV, "info"))
    from memsifter.serving.deadline import set_deadline

    config = load_serve_config(os.environ.get(CONFIG_ENV) or None)
    set_deadline(config.limits.request_deadline_s)  # this worker's protocol reads it
    return create_app(config)


def uvicorn_limits(config: ServeConfig) -> dict[str, Any]:
    """uvicorn's settings for connections: the header deadline's protocol, the connection
    bound (503 past it) and the keep-alive timeout."""
    from memsifter.serving.deadline import protocol_path, set_deadline

    set_deadline(config.limits.request_deadline_s)
    return {
        "http": protocol_path(),
        "limit_concurrency": config.limits.max_connections,
        "timeout_keep_alive": config.keep_alive_s,
    }


def serve(
    config_path: str | Path | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    sample: bool = False,
    log_level: str = "info",
    workers: int = 1,
) -> None:
    import uvicorn

    if workers < 1:
        raise ServeError(f"--workers must be at least 1, got {workers}", field="workers")
    configure_logging(log_level)
    config = load_serve_config(config_path)
    if workers > 1:
        _serve_workers(config, config_path, host, port, sample, log_level, workers)
        return
    prepared = prepare(config, sample=sample)
    _print_sample(config, prepared, host, port)
    uvicorn.run(
        prepared.app,
        host=host,
        port=port,
        log_config=None,
        log_level=log_level,
        **uvicorn_limits(config),
    )


def _serve_workers(
    config: ServeConfig,
    config_path: str | Path | None,
    host: str,
    port: int,
    sample: bool,
    log_level: str,
    workers: int,
) -> None:
    import uvicorn

    own_dir = multiprocess_dir() is None
    metrics_dir = prepare_multiprocess_dir()  # before any worker imports prometheus_client
    store = Store(config.db_url)
    try:
        store.migrate()
    finally:
        store.close()
    if sample:
        prepared = prepare(config, sample=True)  # the key reaches the workers in the environment
        prepared.app.state.services.store.close()
        _print_sample(config, prepared, host, port)
        del prepared
        # This process serves nothing: its worker gauge must not count as a live worker.
        multiprocess.mark_process_dead(os.getpid(), str(metrics_dir))
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve()) if config_path else ""
    os.environ[LOG_LEVEL_ENV] = log_level
    try:
        uvicorn.run(
            "memsifter.serving.server:worker_app",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            log_config=None,
            log_level=log_level,
            **uvicorn_limits(config),
        )
    finally:
        if own_dir:
            remove_multiprocess_dir(metrics_dir)


def _print_sample(config: ServeConfig, prepared: Prepared, host: str, port: int) -> None:
    if prepared.sample_key is not None:
        note = (
            "generated; shown only now"
            if prepared.key_generated
            else f"from ${config.sample_key_env}"
        )
        print(
            f"sample user '{SAMPLE_USER}' seeded for tenant '{config.sample_tenant}' "
            f"(key {note}). Try:\n\n{first_curl(host, port, prepared.sample_key)}\n",
            file=sys.stderr,
            flush=True,
        )
