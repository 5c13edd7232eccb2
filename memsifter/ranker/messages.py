"""The proxy prompt's words: the instructions, every candidate as ``[Session i]`` with its date,
the question with its date, and the answer format ``<think>…</think><ranking>i, j, k</ranking>``
with 0-based ids, in English or Chinese.

``build_messages`` writes them as chat messages with no budget applied;
:class:`~memsifter.ranker.prompt.PromptBuilder` renders them with the model's chat template and
makes them fit the window. The pieces (label, date, turns) are exposed to the builder so the
prompt it assembles from separately tokenized pieces is the text written here, byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from memsifter.data.types import Session

Language = Literal["en", "zh"]
LANGUAGES: tuple[str, ...] = ("en", "zh")
_EXAMPLE = "<ranking>2, 0, 5</ranking>"

_TEXT: dict[str, dict[str, str]] = {
    "en": {
        "system": (
            "You are a memory assistant. You read a user's past chat sessions and decide which "
            "of them help to answer a new question."
        ),
        "intro": (
            "Here are {n} past chat sessions between the user and an assistant. Each one starts "
            "with its id, from [Session 0] to [Session {last}], and its date."
        ),
        "date": "Date",
        "question_date": "Question date: {date}",
        "question": "Question: {question}",
        "task": (
            "Rank the sessions by how useful they are for answering the question, most useful "
            "first. You may leave out sessions that are clearly irrelevant."
        ),
        "format_think": (
            "First reason step by step inside <think> and </think>. Then write the session ids "
            "(numbers from 0 to {last}), separated by commas, inside <ranking> and </ranking>. "
            "Begin your reply with <think>. Example: <think>...</think>" + _EXAMPLE
        ),
        "format_plain": (
            "Write only the session ids (numbers from 0 to {last}), separated by commas, inside "
            "<ranking> and </ranking>. Example: " + _EXAMPLE
        ),
        "truncated": "[… session truncated: {n} tokens omitted …]",
    },
    "zh": {
        "system": (
            "你是一个记忆助手。你会阅读用户过去的聊天会话，并判断其中哪些有助于回答一个新问题。"
        ),
        "intro": (
            "以下是用户与助手之间的 {n} 个历史聊天会话。每个会话以编号"
            "（从 [Session 0] 到 [Session {last}]）和日期开头。"
        ),
        "date": "日期",
        "question_date": "提问日期：{date}",
        "question": "问题：{question}",
        "task": (
            "请按照对回答该问题的有用程度对会话排序，最有用的排在最前面。明显无关的会话可以省略。"
        ),
        "format_think": (
            "先在 <think> 和 </think> 之间逐步推理，然后在 <ranking> 和 </ranking> 之间写出"
            "会话编号（0 到 {last} 的数字），用英文逗号分隔。回复请以 <think> 开头。"
            "示例：<think>...</think>" + _EXAMPLE
        ),
        "format_plain": (
            "只需在 <ranking> 和 </ranking> 之间写出会话编号（0 到 {last} 的数字），"
            "用英文逗号分隔。示例：" + _EXAMPLE
        ),
        "truncated": "[… 会话已截断：省略了 {n} 个 token …]",
    },
}


def _text(language: str) -> dict[str, str]:
    if language not in _TEXT:
        raise ValueError(f"unknown prompt language {language!r}; use one of {LANGUAGES}")
    return _TEXT[language]


def _dated(session: Session, language: str) -> str:
    """The date part of a block's header line (`` Date: …``), or "" for an undated session."""
    date = session.date_text or (session.date.isoformat() if session.date else None)
    return f" {_text(language)['date']}: {date}" if date else ""


def _label(position: int) -> str:
    return f"[Session {position}]"


def _header(position: int, session: Session, language: str) -> str:
    return _label(position) + _dated(session, language)


def _turns(session: Session) -> str:
    return session.render(with_date=False)


def _block(position: int, session: Session, language: str) -> str:
    return f"{_header(position, session, language)}\n{_turns(session)}"


def _messages(
    question: str,
    blocks: Sequence[str],
    n: int,
    question_date: str | None,
    language: str,
    ask_think: bool,
) -> list[dict[str, str]]:
    text = _text(language)
    last = max(n - 1, 0)
    parts = [text["intro"].format(n=n, last=last), "\n\n".join(blocks)]
    asked = [text["question"].format(question=question)]
    if question_date:
        asked.insert(0, text["question_date"].format(date=question_date))
    parts.append("\n".join(asked))
    parts.append(text["task"])
    parts.append(text["format_think" if ask_think else "format_plain"].format(last=last))
    return [
        {"role": "system", "content": text["system"]},
        {"role": "user", "content": "\n\n".join(p for p in parts if p)},
    ]


def build_messages(
    question: str,
    sessions: Sequence[Session],
    question_date: str | None = None,
    language: Language = "en",
    ask_think: bool = True,
) -> list[dict[str, str]]:
    """System and user messages ranking ``sessions`` in the given order: ``sessions[i]`` is
    ``[Session i]``. No budget is applied; use ``PromptBuilder`` for that."""
    blocks = [_block(i, s, language) for i, s in enumerate(sessions)]
    return _messages(question, blocks, len(sessions), question_date, language, ask_think)
