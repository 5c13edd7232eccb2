"""The proxy prompt's words: the instructions, every candidate as ``[Session i]`` with its date,
the question with its date, and the answer format ``<think>…</think><ranking>i, j, k</ranking>``
with 0-based ids, in English or Chinese.

**Labellings.** A candidate's id is its position written in one of :data:`LABELLINGS`:
``digits`` (``0``, ``1``, …, the paper's, and the default) or ``letters`` (``A`` … ``Z`` then
``a`` … ``z``: 52 ids). The first-token head scores each candidate by its id's one token, and
Qwen3 and SmolLM2 split numbers into digits, so ``digits`` labels at most 10 candidates there;
``letters`` are single tokens on both, so one prefill ranks a window of 52. The digits prompt is
the text it always was, byte for byte.

**Layouts.** :data:`LAYOUTS` place the same pieces two ways. ``paper`` (the default, byte for
byte the prompt it always was): the sessions, then the question. ``marked``: the question first
(and again after the sessions, where the task is), and every session closed by its id,
``[End of Session D]``. In a causal model a session's tokens never see a question that comes
after them, so under ``paper`` only the last position can relate the two; under ``marked`` each
closing id is a position that has read the question and its session, and the first-token head
reads the ranking off label tokens, so the id it should point at is a token that already knows
whether its session answers (docs/gym.md, the reading level's findings). ``restated``:
``marked``, and the question again on the line before every closing id, so the position the
marker read scores has the question a line away instead of a window away: each closer reads
like a cross-encoder's ``(session, question) -> relevant?`` (docs/gym.md, finding 22).

``build_messages`` writes them as chat messages with no budget applied;
:class:`~memsifter.ranker.prompt.PromptBuilder` renders them with the model's chat template and
makes them fit the window. The pieces (label, date, turns) are exposed to the builder so the
prompt it assembles from separately tokenized pieces is the text written here, byte for byte.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Literal

from memsifter.data.types import Session

Language = Literal["en", "zh"]
LANGUAGES: tuple[str, ...] = ("en", "zh")
Labelling = Literal["digits", "letters"]
LABELLINGS: tuple[str, ...] = ("digits", "letters")
Layout = Literal["paper", "marked", "restated"]
LAYOUTS: tuple[str, ...] = ("paper", "marked", "restated")
# The layouts that close every session with its id: where the marker read can score.
MARKED_LAYOUTS: tuple[str, ...] = ("marked", "restated")
# Whose prompt the candidates are shown in: ours (this module), or the released MemSifter proxy's
# training prompt (memsifter.ranker.official), rendered exactly as its authors trained it.
TEMPLATES: tuple[str, ...] = ("memsifter", "official")
_LETTERS = string.ascii_uppercase + string.ascii_lowercase
_EXAMPLE = "<ranking>2, 0, 5</ranking>"

_TEXT: dict[str, dict[str, str]] = {
    "en": {
        "system": (
            "You are a memory assistant. You read a user's past chat sessions and decide which "
            "of them help to answer a new question."
        ),
        "intro": (
            "Here are {n} past chat sessions between the user and an assistant. Each one starts "
            "with its id, from [Session {first}] to [Session {last}], and its date."
        ),
        "intro_marked": (
            "Here are {n} past chat sessions between the user and an assistant. Each one starts "
            "with its id and its date, from [Session {first}] to [Session {last}], and ends with "
            "its id again, [End of Session {first}] to [End of Session {last}]."
        ),
        "intro_restated": (
            "Here are {n} past chat sessions between the user and an assistant. Each one starts "
            "with its id and its date, from [Session {first}] to [Session {last}], and ends with "
            "the question again and its id, [End of Session {first}] to [End of Session {last}]."
        ),
        "asked_first": "The question the sessions are ranked for:",
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
        # No example: the head reads the first id off the logits right after <ranking>, and an
        # example's first id became its prior (docs/gym.md, finding 12: an untrained SmolLM2
        # put the example's C first on 200 of 200 prompts).
        "format_letters": (
            "Write only the session ids (letters from A to {last}), most useful first, "
            "separated by commas, inside <ranking> and </ranking>."
        ),
        "truncated": "[… session truncated: {n} tokens omitted …]",
    },
    "zh": {
        "system": (
            "你是一个记忆助手。你会阅读用户过去的聊天会话，并判断其中哪些有助于回答一个新问题。"
        ),
        "intro": (
            "以下是用户与助手之间的 {n} 个历史聊天会话。每个会话以编号"
            "（从 [Session {first}] 到 [Session {last}]）和日期开头。"
        ),
        "intro_marked": (
            "以下是用户与助手之间的 {n} 个历史聊天会话。每个会话以编号和日期开头"
            "（从 [Session {first}] 到 [Session {last}]），并以同一编号结尾"
            "（[End of Session {first}] 到 [End of Session {last}]）。"
        ),
        "intro_restated": (
            "以下是用户与助手之间的 {n} 个历史聊天会话。每个会话以编号和日期开头"
            "（从 [Session {first}] 到 [Session {last}]），并以问题和同一编号结尾"
            "（[End of Session {first}] 到 [End of Session {last}]）。"
        ),
        "asked_first": "需要为其排序会话的问题：",
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
        "format_letters": (
            "只需在 <ranking> 和 </ranking> 之间写出会话编号（A 到 {last} 的字母），"
            "最有用的排在最前面，用英文逗号分隔。"
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


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def check_labelling(labels: str) -> None:
    if labels not in LABELLINGS:
        raise ValueError(f"labels must be one of {LABELLINGS}, got {labels!r}")


def labelling_size(labels: str) -> int | None:
    """How many ids ``labels`` can write at all (None: no bound; a tokenizer may bound it)."""
    check_labelling(labels)
    return len(_LETTERS) if labels == "letters" else None


def candidate_label(position: int, labels: str = "digits") -> str:
    """The id of the candidate at ``position`` as the prompt writes it (``3``, or ``D``)."""
    if labels == "digits":
        return str(position)
    check_labelling(labels)
    if not 0 <= position < len(_LETTERS):
        raise ValueError(f"labels: letters has {len(_LETTERS)} ids (A..z), not {position + 1}")
    return _LETTERS[position]


def answer_label(position: int, labels: str = "digits") -> str:
    """The id as an answer writes it right after ``<ranking>``, the text of the first-token
    head's one label token: digits bare (``3``), letters after a space (`` D``). The space
    makes a letter's token the one its ``[Session D]`` header shows it with, on SmolLM2's and
    Qwen3's tokenizers alike, and it is the only form that is one token on Qwen3: its
    pre-tokenizer glues a bare letter to the ``>`` before it, and its vocabulary merges most
    such pairs (``>A``), so a bare letter would not be a token of its own there."""
    label = candidate_label(position, labels)
    return " " + label if labels == "letters" else label


def _label(position: int, labels: str = "digits") -> str:
    return f"[Session {candidate_label(position, labels)}]"


def _header(position: int, session: Session, language: str, labels: str = "digits") -> str:
    return _label(position, labels) + _dated(session, language)


CLOSER_OPEN = "[End of Session"  # a marked block's last line opens with this, and nothing else does


def _trailer(position: int, labels: str = "digits") -> str:
    """A ``marked`` block's last line: its id again, the same label token its header shows."""
    return f"{CLOSER_OPEN} {candidate_label(position, labels)}]"


def _turns(session: Session) -> str:
    return session.render(with_date=False)


def restated_line(question: str, language: str) -> str:
    """The line a ``restated`` block shows before its closing id: the question, as the prompt
    asks it (without its date)."""
    return _text(language)["question"].format(question=question)


def _closed(block: str, position: int, labels: str, layout: str, restated: str = "") -> str:
    """``block`` (header and turns) as the layout shows it: closed by its id under ``marked``,
    by ``restated`` (:func:`restated_line`) and its id under ``restated``."""
    if layout == "restated":
        return f"{block}\n{restated}\n{_trailer(position, labels)}"
    return f"{block}\n{_trailer(position, labels)}" if layout == "marked" else block


def _block(
    position: int,
    session: Session,
    language: str,
    labels: str = "digits",
    layout: str = "paper",
    restated: str = "",
) -> str:
    block = f"{_header(position, session, language, labels)}\n{_turns(session)}"
    return _closed(block, position, labels, layout, restated)


def _messages(
    question: str,
    blocks: Sequence[str],
    n: int,
    question_date: str | None,
    language: str,
    ask_think: bool,
    labels: str = "digits",
    layout: str = "paper",
) -> list[dict[str, str]]:
    text = _text(language)
    check_layout(layout)
    first, last = candidate_label(0, labels), candidate_label(max(n - 1, 0), labels)
    asked = [text["question"].format(question=question)]
    if question_date:
        asked.insert(0, text["question_date"].format(date=question_date))
    if layout in MARKED_LAYOUTS:
        parts = [
            "\n".join([text["asked_first"], *asked]),
            text[f"intro_{layout}"].format(n=n, first=first, last=last),
        ]
    else:
        parts = [text["intro"].format(n=n, first=first, last=last)]
    parts.append("\n\n".join(blocks))
    parts.append("\n".join(asked))
    parts.append(text["task"])
    if labels == "letters":
        if ask_think:  # the parser reads digits: letters are the first-token head's alone
            raise ValueError("labels: letters is for ranking_head: first_token (no reasoning)")
        parts.append(text["format_letters"].format(last=last))
    else:
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
    labels: Labelling = "digits",
    layout: Layout = "paper",
) -> list[dict[str, str]]:
    """System and user messages ranking ``sessions`` in the given order: ``sessions[i]`` is
    ``[Session i]`` (``labels``: its id in digits or letters; ``layout``: see the module doc).
    No budget is applied; use ``PromptBuilder`` for that."""
    restated = restated_line(question, language)
    blocks = [_block(i, s, language, labels, layout, restated) for i, s in enumerate(sessions)]
    return _messages(
        question, blocks, len(sessions), question_date, language, ask_think, labels, layout
    )
