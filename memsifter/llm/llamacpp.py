"""llama.cpp on CPU: export a model to GGUF and serve it through ``llama-server``, the
OpenAI-compatible server that the existing ``openai`` backend talks to.

llama.cpp is built from a pinned source release on PyPI (the sdist of ``llama-cpp-python``, which
vendors it) by the launcher ``memsifter/resources/llamacpp_server.sh`` (package data;
``scripts/llamacpp_server.sh`` runs it from a checkout) into ``.llamacpp/`` (or
``$MEMSIFTER_LLAMACPP_DIR``): ``src/`` is the llama.cpp tree, ``build/bin/llama-server`` the
binary. This module drives that script and the tree's ``convert_hf_to_gguf.py``::

    with launch_llamacpp_server("memsifter-smollm2-135m-locomo") as base_url:
        build_backend(BackendSpec(kind="openai", model="memsifter-smollm2-135m-locomo",
                                  base_url=base_url))

**Why the outputs agree with transformers.** Any model name works (a hub folder, a built-in, a
LoRA adapter, which is merged first by :func:`memsifter.models.plain_model_folder`); it is exported
once, by default as **f32**, to ``cache_dir()/gguf/``. f32 keeps the very weights the fp32
transformers backend computes with (the built-in SmolLM2 is itself dequantized from Q4_1, so a
quantized export would change the model, not just its speed). The proxy sends prompts as token
ids counted with the Hugging Face tokenizer (:mod:`memsifter.llm.openai_http`); llama-server takes
a list of ids as the prompt and adds no BOS to it, so both engines read the same tokens and greedy
decoding differs only where the two kernels' float sums differ at a near-tie.

**The marker read** (``head_read: marker``) needs one token's logit at every candidate's closing
marker, which the completions API never returns. ``launch_llamacpp_server(..., marker_read=True)``
(the launcher's ``--marker-read``) starts llama-server with ``--embeddings --pooling none`` and a
micro-batch as large as a slot's context: its ``/embeddings`` endpoint then returns every token's
hidden state after the final norm, not normalised (llama.cpp's ``result_norm`` tensor, read back
unpooled; an embeddings request cannot be split across micro-batches, hence the batch size). The
client (:meth:`memsifter.llm.openai_http.OpenAIBackend.marker_logits`) multiplies the markers'
states by the LM head's row of the read token, :func:`output_row`, read from the folder the GGUF
was exported from (f32: the same numbers). An embeddings server answers embeddings only.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from memsifter.errors import MemSifterError
from memsifter.llm.local_server import free_port, run_server
from memsifter.resources import LLAMACPP_SERVER

SCRIPT = LLAMACPP_SERVER
DIR_ENV = "MEMSIFTER_LLAMACPP_DIR"
DEFAULT_DIR = ".llamacpp"
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


class LlamaCppError(MemSifterError):
    """llama.cpp is not set up, an export failed, or the server did not come up."""


def llamacpp_dir() -> Path:
    """The build folder: ``$MEMSIFTER_LLAMACPP_DIR`` or ``.llamacpp``, a relative one read against
    the working directory (the repository root, in a checkout)."""
    return Path(os.environ.get(DIR_ENV) or DEFAULT_DIR).expanduser().resolve()


def server_binary() -> Path:
    return llamacpp_dir() / "build" / "bin" / "llama-server"


def converter() -> Path:
    return llamacpp_dir() / "src" / "convert_hf_to_gguf.py"


def _setup_hint() -> str:
    return f"bash scripts/llamacpp_server.sh --setup-only (outside a checkout: bash {SCRIPT} ...)"


def is_built() -> bool:
    return server_binary().is_file() and converter().is_file()


def _script_env() -> dict[str, str]:
    """The launcher's environment: this interpreter (its pip downloads the source; it resolves
    model names) and the build folder as an absolute path, so both sides agree on it."""
    return {**os.environ, "MEMSIFTER_PYTHON": sys.executable, DIR_ENV: str(llamacpp_dir())}


def setup_llamacpp(timeout: float = 7200) -> None:
    """Build ``llama-server`` if it is missing or stale (``--setup-only``: a ~77 MB download and
    a compile, ~10-30 min on 2 cores; a no-op afterwards)."""
    if not SCRIPT.is_file():
        raise LlamaCppError(
            f"{SCRIPT} not found: the memsifter install lacks its package data "
            "(memsifter/resources/); reinstall it from a wheel or a checkout"
        )
    done = subprocess.run(
        ["bash", str(SCRIPT), "--setup-only"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=_script_env(),
    )
    if done.returncode != 0:
        out = "\n".join((done.stdout + done.stderr).splitlines()[-60:])
        raise LlamaCppError(f"building llama.cpp in {llamacpp_dir()} failed:\n{out}")


# ---- GGUF export -----------------------------------------------------------------------------


def export_gguf(model: str, out: str | Path, outtype: str = "f32") -> Path:
    """Write ``model`` (any model name: hub folder, built-in, LoRA adapter, merged first) as one
    GGUF file at ``out`` with llama.cpp's own ``convert_hf_to_gguf.py``. Written to a temporary
    sibling and renamed into place, so a reader never sees half a file."""
    if outtype not in OUTTYPES:
        raise LlamaCppError(f"unknown GGUF type {outtype!r}; choose one of {', '.join(OUTTYPES)}")
    script = converter()
    if not script.is_file():
        raise LlamaCppError(f"llama.cpp is not set up ({script} missing): run {_setup_hint()}")
    from memsifter.models import plain_model_folder, resolve_model

    folder = Path(plain_model_folder(model))
    if not resolve_model(model).local or not (folder / "config.json").is_file():
        raise LlamaCppError(
            f"{model!r} is not a local model folder with a config.json; export needs its files "
            "(download a hub model first)"
        )
    out = Path(out).expanduser().resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # The converter puts the tree's own gguf-py first on its path, so converter and server agree
    # on the format whatever gguf package this environment has.
    cmd = [sys.executable, str(script), str(folder), "--outfile", str(tmp), "--outtype", outtype]
    try:
        done = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
            raise LlamaCppError(f"exporting {model} to GGUF failed ({' '.join(cmd)}):\n{tail}")
        tmp.chmod(out.parent.stat().st_mode & 0o666)  # mkstemp made it owner-only
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _folder_digest(folder: Path) -> str:
    """What an export depends on: the model folder's files (names, sizes, times) and llama.cpp's
    converter, so a retrained model or another llama.cpp is exported again."""
    h = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    h.update(converter().read_bytes() if converter().is_file() else b"")
    return h.hexdigest()[:16]


def gguf_for(model: str, outtype: str = "f32") -> Path:
    """``model`` as GGUF, exported once to ``cache_dir()/gguf/<name>-<digest>.<outtype>.gguf``
    (under a file lock, so concurrent callers export once). A ``.gguf`` file is returned as is."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise LlamaCppError(f"GGUF file {path} does not exist")
        return path.resolve()
    from filelock import FileLock

    from memsifter.models import cache_dir, plain_model_folder

    folder = Path(plain_model_folder(model))
    if not folder.is_dir():
        raise LlamaCppError(f"{model!r} is not a local model (export needs its files)")
    name = Path(model).name if path.exists() else model.replace("/", "--")
    dest = cache_dir() / "gguf" / f"{name}-{_folder_digest(folder)}.{outtype}.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if not dest.is_file():
            export_gguf(model, dest, outtype)
    return dest


# ---- the LM head's row, for the marker read -------------------------------------------------


def output_row(model: str | Path, token_id: int) -> tuple[list[float], float]:
    """Row ``token_id`` of the output embedding (the LM head) of the Hugging Face model folder
    ``model``, and its bias (0 without one), read from its safetensors alone: the weights
    llama.cpp's marker read multiplies the hidden states by. Where the config ties the LM head
    to the input embedding (``tie_word_embeddings``, SmolLM2 and Qwen3's small models) the row
    is the input embedding's (``lm_head.weight`` is then not saved, or ignored by transformers);
    else it is ``lm_head.weight``. Refused by name when the folder lacks either."""
    import json

    from safetensors import safe_open
    from transformers import AutoConfig

    folder = Path(model)
    if not (folder / "config.json").is_file():
        raise LlamaCppError(f"{folder} is not a local model folder with a config.json")
    config = AutoConfig.from_pretrained(str(folder))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    tied = bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        where = dict(json.loads(index.read_text())["weight_map"])
    else:
        single = folder / "model.safetensors"
        if not single.is_file():
            raise LlamaCppError(f"{folder} holds no model.safetensors (nor a sharded index)")
        with safe_open(str(single), framework="pt") as f:
            where = {k: single.name for k in f.keys()}
    if tied:
        names = [k for k in where if k.endswith("embed_tokens.weight")]
        wanted = "the input embedding (*embed_tokens.weight; the config ties the LM head to it)"
    else:
        names = [k for k in where if k == "lm_head.weight" or k.endswith(".lm_head.weight")]
        wanted = "lm_head.weight (the config does not tie it to the input embedding)"
    if len(names) != 1:
        raise LlamaCppError(f"{folder}: found {names or 'no tensor'} for {wanted}")
    name = names[0]
    with safe_open(str(folder / where[name]), framework="pt") as f:
        weight = f.get_slice(name)
        rows = weight.get_shape()[0]
        if not 0 <= token_id < rows:
            raise LlamaCppError(f"{folder}: token {token_id} is outside {name}'s {rows} rows")
        row = weight[token_id : token_id + 1][0].double().tolist()
    bias = 0.0
    bias_name = name.removesuffix("weight") + "bias"
    if not tied and bias_name in where:
        with safe_open(str(folder / where[bias_name]), framework="pt") as f:
            bias = float(f.get_slice(bias_name)[token_id : token_id + 1][0].double())
    return row, bias


# ---- the server ------------------------------------------------------------------------------


@contextlib.contextmanager
def launch_llamacpp_server(
    model: str | Path,
    port: int | None = None,
    timeout: float = 120,
    *,
    served_model_name: str | None = None,
    outtype: str = "f32",
    threads: int | None = None,
    ctx_size: int = 4096,
    parallel: int = 4,
    extra_args: Sequence[str] = (),
    log_path: str | Path | None = None,
    setup: bool = True,
    marker_read: bool = False,
) -> Iterator[str]:
    """Serve ``model`` (a ``.gguf`` file, or any model name, exported once by :func:`gguf_for`)
    with llama-server and yield the OpenAI base URL, ``http://127.0.0.1:PORT/v1``.

    ``marker_read``: serve the first-token head's marker read instead of completions
    (``--embeddings --pooling none``, a micro-batch of ``ctx_size`` tokens; the module doc):
    talk to it with ``BackendSpec(kind="openai", server="llamacpp", ...)``.

    ``served_model_name`` defaults to the model name (the GGUF's stem for a file). ``ctx_size``
    is each slot's KV cache in tokens, ``parallel`` the slots decoded together, ``threads`` the
    compute threads (default: every core). ``timeout`` bounds the startup only; ``setup`` first
    builds llama.cpp if needed, outside that timeout.
    """
    if setup:
        setup_llamacpp()
    elif not is_built():
        raise LlamaCppError(f"llama.cpp is not built in {llamacpp_dir()}: run {_setup_hint()}")
    model = str(model)
    gguf = gguf_for(model, outtype)
    if served_model_name is None:
        served_model_name = gguf.stem if model.endswith(".gguf") else Path(model).name
    port = port or free_port()
    cmd = ["bash", str(SCRIPT), "--model", str(gguf), "--port", str(port)]
    cmd += ["--served-model-name", served_model_name]
    cmd += ["--ctx-size", str(ctx_size), "--parallel", str(parallel)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if marker_read:
        cmd += ["--marker-read"]
    cmd += list(extra_args)
    with run_server(
        cmd,
        port=port,
        served_name=served_model_name,
        timeout=timeout,
        label="llama.cpp server",
        error=LlamaCppError,
        env=_script_env(),
        log_path=log_path,
    ) as base_url:
        yield base_url


__all__ = [
    "LlamaCppError",
    "export_gguf",
    "gguf_for",
    "is_built",
    "launch_llamacpp_server",
    "llamacpp_dir",
    "output_row",
    "setup_llamacpp",
]
