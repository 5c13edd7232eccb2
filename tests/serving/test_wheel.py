"""The package installs and serves without the checkout: what the library reads besides its code
ships as package data (``memsifter/resources/``, ``memsifter/proxies/``), and each such file has
one home (the checkout's ``configs/serve/default.yaml`` is a link to the packaged default).

The slow test builds the wheel from a copy of the sources (setuptools' ``build/`` folder keeps
files of earlier builds, so an in-tree build could ship a module that no longer exists), installs
it into a fresh venv, and runs ``memsifter serve --help`` and a coarse-only recall from a folder
outside the checkout. That venv reaches the test venv's dependencies through a ``.pth`` line
naming its site-packages: a plain path line, so the editable install's finder there (which maps
``memsifter`` to this checkout) is not run, and the test asserts ``memsifter`` comes from the wheel.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest

from memsifter.resources import SERVE_DEFAULT, VLLM_CPU_SERVER
from memsifter.testing.launch import free_port
from memsifter.testing.server import printed_key, wait_ready

ROOT = Path(__file__).resolve().parents[2]
# Besides the code: what memsifter reads from its own folder, by path inside the wheel.
PACKAGE_DATA = (
    "memsifter/resources/serve_default.yaml",
    "memsifter/resources/vllm_cpu_server.sh",
    "memsifter/resources/llamacpp_server.sh",
    "memsifter/resources/ui/index.html",  # the recall inspector at /ui
    "memsifter/resources/ui/app.js",
    "memsifter/resources/ui/style.css",
    "memsifter/serving/migrations/script.py.mako",
    "memsifter/proxies/memsifter-smollm2-135m-locomo/adapter_model.safetensors",
    "memsifter/proxies/memsifter-smollm2-135m-locomo/prompt_spec.json",
    "memsifter/proxies/memsifter-smollm2-135m-locomo/tokenizer.json",
)


def test_serve_default_has_one_home() -> None:
    """``configs/serve/default.yaml`` is the packaged file itself, not a copy that could drift."""
    user_facing = ROOT / "configs" / "serve" / "default.yaml"
    assert user_facing.is_symlink(), f"{user_facing} must link to {SERVE_DEFAULT}"
    assert user_facing.resolve() == SERVE_DEFAULT
    assert SERVE_DEFAULT.is_relative_to(ROOT / "memsifter")


def test_the_library_reads_no_checkout_paths() -> None:
    """No module finds a file by climbing out of the package (``parents[2]`` of a module in a
    subpackage is the checkout) and joining ``"scripts"`` or ``"configs"`` to it. (Defaults such
    as ``configs/rewards/default.yaml`` in a training config are paths a user may type, read
    against the working directory, not files the library itself needs.)"""
    pattern = re.compile(r"parents\[[2-9]\]|/\s*[\"'](scripts|configs)[\"']")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in sorted((ROOT / "memsifter").rglob("*.py"))
        if path.name != "locations.py"  # ../shared/data beside the checkout, for tests/benchmarks
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert not offenders, "\n".join(offenders)


def _run(cmd: list[str], cwd: Path, timeout: float = 600, **kw) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *(p.name for p in ROOT.glob("LICEN[CS]E*"))):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "memsifter", src / "memsifter", ignore=shutil.ignore_patterns("__pycache__")
    )
    out = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + [str(src), "-w", str(out)],
        cwd=tmp_path,
    )
    (wheel,) = out.glob("memsifter-*.whl")
    return wheel


def _venv_with_wheel(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    # Install before the .pth exists, so pip sees only the new venv (never the editable install).
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
        + ["--no-index", str(wheel)],
        cwd=tmp_path,
    )
    site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            cwd=tmp_path,
        ).strip()
    )
    (site / "zz_test_venv_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.mark.slow
def test_wheel_serves_outside_the_checkout(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [p for p in PACKAGE_DATA if p not in names]
    assert not missing, f"{wheel.name} lacks package data {missing} (pyproject's package-data)"
    assert not any(n.startswith(("configs/", "scripts/", "tests/")) for n in names)

    venv = _venv_with_wheel(tmp_path, wheel)
    work = tmp_path / "elsewhere"  # the working directory: no checkout in it or above it
    work.mkdir()
    drop = ("PYTHONPATH", "MEMSIFTER_DEMO_KEY", "MEMSIFTER_SERVE_DB_URL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    where = _run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import memsifter, memsifter.resources as r; "
            "print(memsifter.__file__); print(r.SERVE_DEFAULT); print(r.VLLM_CPU_SERVER)",
        ],
        cwd=work,
        env=env,
    ).splitlines()
    for path in where:
        assert Path(path).is_relative_to(venv), f"{path} is not the installed wheel's"
        assert Path(path).is_file(), path
    assert Path(where[1]).read_bytes() == SERVE_DEFAULT.read_bytes()
    assert Path(where[2]).read_bytes() == VLLM_CPU_SERVER.read_bytes()

    memsifter = str(venv / "bin" / "memsifter")
    assert "--config" in _run([memsifter, "serve", "--help"], cwd=work, env=env)

    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [memsifter, "serve", "--port", str(port), "--seed-sample"],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        printed = wait_ready(proc, port, log)
        key = printed_key(printed)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/users/alice/recall",
            headers={"Authorization": f"Bearer {key}"},
            json={"question": "What is my dog called?", "top_k": 2},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ranker"] == "coarse-only"
        assert len(body["hits"]) == 2
        assert any("Max" in h["text"] for h in body["hits"])
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    # The default config's SQLite file lands in the working directory, not in the checkout.
    assert (work / "memsifter.db").is_file()


_CLIENT_SCRIPT = r"""
import json, sys
from importlib.util import find_spec
from memsifter.integrations.langchain import MemSifterRetriever as LCRetriever
from memsifter.integrations.llama_index import MemSifterRetriever as LIRetriever
url, key = sys.argv[1], sys.argv[2]
docs = LCRetriever(base_url=url, api_key=key, user_id="alice", top_k=2).invoke("dog's name?")
nodes = LIRetriever(base_url=url, api_key=key, user_id="alice", top_k=2).retrieve("dog's name?")
heavy = [m for m in ("torch", "transformers", "sentence_transformers", "bm25s") if find_spec(m)]
print(json.dumps({
    "langchain": [d.page_content for d in docs],
    "llama_index": [n.node.get_content() for n in nodes],
    "heavy": heavy,
}))
"""


@pytest.mark.slow
def test_the_client_install_pulls_no_torch_and_recalls(tmp_path: Path) -> None:
    """``pip install 'memsifter[client]'`` into a clean venv, resolved from the package index:
    no torch (nor transformers, sentence-transformers, bm25s) is installed, and the LangChain
    and LlamaIndex adapters recall from a live service."""
    from memsifter.serving.config import ApiKeySettings, ServeConfig
    from memsifter.serving.store import hash_key
    from memsifter.testing.server import live_server

    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "client-venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_NO_INDEX")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    _run(
        [python, "-m", "pip", "install", "-q", f"memsifter[client] @ {wheel.as_uri()}"],
        cwd=tmp_path,
        timeout=1200,
        env=env,
    )
    installed = _run([python, "-m", "pip", "list", "--format", "freeze"], cwd=tmp_path, env=env)
    names = {line.split("==")[0].lower() for line in installed.splitlines()}
    assert "memsifter" in names and "langchain-core" in names and "llama-index-core" in names
    assert not names & {"torch", "transformers", "sentence-transformers", "flagembedding"}

    key = "key-client-install-0123456789"
    config = ServeConfig(
        db_url=f"sqlite:///{tmp_path / 'client.db'}",
        api_keys=[ApiKeySettings(tenant="acme", key_sha256=hash_key(key))],
    )
    with live_server(config) as url:
        session = {
            "id": "dog",
            "date": "2024-05-01T10:00:00",
            "turns": [{"speaker": "user", "text": "My dog is called Max."}],
        }
        other = {
            "id": "run",
            "date": "2024-05-02T10:00:00",
            "turns": [{"speaker": "user", "text": "I run the Lisbon half marathon."}],
        }
        r = httpx.post(
            f"{url}/v1/users/alice/sessions",
            headers={"Authorization": f"Bearer {key}"},
            json={"sessions": [session, other]},
            timeout=60,
        )
        assert r.status_code == 201, r.text
        out = _run([python, "-c", _CLIENT_SCRIPT, url, key], cwd=tmp_path, env=env, timeout=300)
    got = json.loads(out.strip().splitlines()[-1])
    assert got["heavy"] == []
    for texts in (got["langchain"], got["llama_index"]):
        assert len(texts) == 2 and "Max" in texts[0]


ML_PACKAGES = {"torch", "transformers", "numpy", "sentence-transformers", "flagembedding", "bm25s"}


def test_the_core_and_the_client_extra_name_no_ml_package() -> None:
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        out = set()
        for r in map(Requirement, reqs):
            if r.name == "memsifter":  # a self-reference: that extra's own requirements
                out |= {n for e in r.extras for n in names(extras[e])}
            else:
                out.add(r.name.lower())
        return out

    assert not names(project["dependencies"] + extras["client"]) & ML_PACKAGES
    for extra in ("train", "serve", "gpu"):  # what ranks, trains or serves has the ML stack
        assert ML_PACKAGES <= names(extras[extra]), extra


def test_the_client_and_adapters_import_without_the_ml_stack() -> None:
    code = (
        "import sys, memsifter.serving.client, memsifter.integrations.langchain, "
        "memsifter.integrations.llama_index; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'transformers', 'numpy', 'sentence_transformers', 'bm25s', 'sqlalchemy'}))"
    )
    out = _run([sys.executable, "-c", code], cwd=ROOT)
    # llama-index-core itself imports numpy; ours must add none of the rest.
    assert set(ast.literal_eval(out)) <= {"numpy", "sqlalchemy"}, out
