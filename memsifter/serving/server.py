"""``memsifter serve``: build the app from a config, optionally seed a sample, run uvicorn.

With ``--seed-sample`` the sample tenant's key comes from ``$MEMSIFTER_DEMO_KEY`` (the config's
``sample_key_env``) or, when that is unset, is generated and printed once: the store keeps only
its hash, so it cannot be shown again.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from memsifter.serving.app import create_app
from memsifter.serving.config import ServeConfig, load_serve_config
from memsifter.serving.errors import ServeError
from memsifter.serving.logs import configure_logging
from memsifter.serving.sample import SAMPLE_USER, seed_sample
from memsifter.serving.store import hash_key


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


def serve(
    config_path: str | Path | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    sample: bool = False,
    log_level: str = "info",
) -> None:
    import uvicorn

    configure_logging(log_level)
    config = load_serve_config(config_path)
    prepared = prepare(config, sample=sample)
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
    uvicorn.run(prepared.app, host=host, port=port, log_config=None, log_level=log_level)
