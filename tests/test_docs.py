"""The README stays a front page, and the documentation it points to stays true.

- README.md is at most 15 KB (the depth lives in docs/).
- Every relative link in README.md and docs/*.md reaches a file, and ``file.md#anchor`` a heading
  of that file (GitHub's slugs).
- Every ``memsifter …`` command shown in their code blocks (and inline code) names a command the
  CLI has, with options that command has. Nothing is executed.
- The README's in-process Python example runs.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_LIMIT = 15 * 1024  # bytes


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def _ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(ROOT).as_posix() for p in paths]


# --------------------------------------------------------------------------- markdown parsing

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")


def split_fences(text: str) -> tuple[str, list[tuple[str, str]]]:
    """(the text outside fenced code blocks, [(language, block body), ...])."""
    prose: list[str] = []
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    lang = ""
    body: list[str] = []
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence, lang, body = m.group(1), m.group(2).lower(), []
                prose.append("")
            else:
                prose.append(line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            blocks.append((lang, "\n".join(body)))
            fence = None
            prose.append("")
        else:
            body.append(line)
    return "\n".join(prose), blocks


INLINE_CODE = re.compile(r"(`+)(.+?)\1", flags=re.S)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation other than ``-``
    and ``_`` dropped, each space a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_fences(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose.splitlines():
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = github_slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(text: str) -> list[str]:
    prose, _ = split_fences(text)
    prose = INLINE_CODE.sub("", prose)
    return LINK.findall(prose)


def broken_links(path: Path) -> list[str]:
    """Every relative link of ``path`` that does not resolve, with the reason."""
    problems = []
    for target in links(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):  # http:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{target}: no such file {dest}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: no heading #{anchor} in {dest.name}")
    return problems


# --------------------------------------------------------------------------- commands


def shown_commands(text: str) -> Iterator[str]:
    """``memsifter …`` lines of the shell code blocks (continuations joined)."""
    _, blocks = split_fences(text)
    for lang, body in blocks:
        if lang not in ("", "bash", "sh", "shell", "console"):
            continue
        for line in re.sub(r"\\\n", " ", body).splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("memsifter "):
                yield line


def inline_commands(text: str) -> Iterator[str]:
    """``memsifter …`` inline code spans of the prose."""
    prose, _ = split_fences(text)
    for m in INLINE_CODE.finditer(prose):
        code = " ".join(m.group(2).split())
        if code.startswith("memsifter "):
            yield code


@functools.cache
def cli_root():  # noqa: ANN201 - typer's click command
    import typer

    from memsifter.cli import app

    return typer.main.get_command(app)


def command_problem(line: str) -> str | None:
    """Why ``line`` would not parse with ``memsifter``'s CLI, or None: the subcommand path must
    exist and every ``--option`` (bracketed optional ones too) must be one of that command's."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:
        return f"{line!r}: {e}"
    if not words or words[0] != "memsifter":
        return f"{line!r}: not a memsifter command"
    words = [w.strip("[]") for w in words[1:]]
    words = [w for w in words if w and w not in ("...", "…")]
    cmd, path = cli_root(), ["memsifter"]
    while hasattr(cmd, "commands"):
        if not words or words[0] in ("--help", "-h"):
            return None if words else f"{line!r}: `{' '.join(path)}` needs a subcommand"
        name = words.pop(0)
        if name not in cmd.commands:
            return f"{line!r}: no command `{' '.join([*path, name])}`"
        cmd, path = cmd.commands[name], [*path, name]
    known = {"--help"}
    for param in cmd.params:
        known.update(o for o in [*param.opts, *param.secondary_opts] if o.startswith("-"))
    for word in words:
        if re.match(r"^--?[A-Za-z]", word):
            option = word.split("=", 1)[0]
            if option not in known:
                return f"{line!r}: `{' '.join(path)}` has no option {option}"
    return None


# --------------------------------------------------------------------------- the checks


def test_the_readme_is_a_front_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size:,} bytes; move depth to docs/ (limit 15 KB)"


def test_the_readme_keeps_the_two_commands_and_the_curl() -> None:
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/run.sh" in text and "bash scripts/test.sh" in text
    assert "`scripts/test.sh` is what CI runs (`.ci/run`)" in text
    assert "curl -s http://127.0.0.1:8080/v1/users/alice/recall" in text


@pytest.mark.parametrize("path", doc_files(), ids=_ids(doc_files()))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


@pytest.mark.parametrize("path", doc_files(), ids=_ids(doc_files()))
def test_shown_commands_parse(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    problems = [p for line in shown_commands(text) if (p := command_problem(line))]
    problems += [p for line in inline_commands(text) if (p := command_problem(line))]
    assert problems == []


def test_the_docs_show_commands() -> None:
    """The command check reads something: the blocks it parses hold the documented commands."""
    lines = [line for p in doc_files() for line in shown_commands(p.read_text(encoding="utf-8"))]
    shown = {tuple(shlex.split(line, comments=True)[1:3]) for line in lines}
    assert ("eval", "retrieval") in shown and ("data", "rl") in shown
    assert any(line.startswith("memsifter serve ") for line in lines)
    assert len(lines) >= 15


def test_the_readme_python_example_runs() -> None:
    _, blocks = split_fences(README.read_text(encoding="utf-8"))
    examples = [body for lang, body in blocks if lang == "python" and "build_filter" in body]
    assert len(examples) == 1
    done = subprocess.run(
        [sys.executable, "-c", examples[0]], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("('s2'"), done.stdout


# --------------------------------------------------------------------------- the checkers fail


def test_the_command_check_flags_what_the_cli_lacks() -> None:
    assert (
        command_problem("memsifter eval retrieval --data PATH --retriever bm25 --out DIR") is None
    )
    assert command_problem("memsifter merge CKPT... --out DIR [--dtype bf16|fp16|fp32]") is None
    assert command_problem("memsifter serve --port=8080  # a comment --no-such-flag") is None
    assert command_problem("memsifter eval --help") is None
    assert "no command `memsifter nosuch`" in (command_problem("memsifter nosuch --out x") or "")
    assert "no command" in (command_problem("memsifter eval nosuch") or "")
    assert "needs a subcommand" in (command_problem("memsifter data") or "")
    bad = command_problem("memsifter serve --port 8080 [--no-such-flag X]")
    assert bad is not None and "--no-such-flag" in bad
    assert command_problem("memsifter train C.yaml --answerer-urll U") is not None
    assert command_problem("memsifter data rl --recipe R --out D -z") is not None


def test_commands_are_collected_from_blocks_and_continuations() -> None:
    text = "\n".join(
        [
            "Run `memsifter nosuch` inline.",
            "```bash",
            "memsifter eval retrieval --data PATH \\",
            "    --no-such-flag 1",
            "```",
            "  ```sh",
            "  memsifter serve --port 1",
            "  ```",
            "```python",
            "memsifter nothing  # not shell",
            "```",
        ]
    )
    lines = list(shown_commands(text))
    assert lines[1] == "memsifter serve --port 1" and len(lines) == 2
    assert "--no-such-flag" in (command_problem(lines[0]) or "")
    assert [command_problem(c) is not None for c in inline_commands(text)] == [True]


def test_the_link_check_flags_missing_files_and_anchors(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## Is it learning?\n\n```bash\n# not a heading\n```\n", encoding="utf-8"
    )
    page = tmp_path / "README.md"
    page.write_text(
        "\n".join(
            [
                "# Front",
                "[ok](docs/a.md) [ok](docs/a.md#is-it-learning) [ok](#front)",
                "[web](https://example.com/x#y) `[code](nowhere.md)`",
                "[gone](docs/b.md) [bad anchor](docs/a.md#not-a-heading)",
                "[split",
                "text](docs/a.md#a-page) [self](#nope)",
            ]
        ),
        encoding="utf-8",
    )
    problems = broken_links(page)
    assert len(problems) == 3, problems
    assert any("docs/b.md" in p for p in problems)
    assert any("#not-a-heading" in p for p in problems)
    assert any("#nope" in p for p in problems)


def test_github_slugs() -> None:
    assert github_slug("Is the proxy learning?") == "is-the-proxy-learning"
    assert (
        github_slug("Serving the proxy with llama.cpp (CPU)")
        == "serving-the-proxy-with-llamacpp-cpu"
    )
    assert github_slug("transformers 5 and FlagEmbedding") == "transformers-5-and-flagembedding"
    assert github_slug("The world (`memsifter/data/gym.py`)") == "the-world-memsifterdatagympy"
    assert github_slug("Training: Plackett–Luce GRPO") == "training-plackettluce-grpo"
