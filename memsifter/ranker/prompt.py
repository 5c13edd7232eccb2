"""The one prompt builder for the proxy: training, evaluation and serving all build through here,
so the model is served exactly the prompt it was trained on.

``build_messages`` writes the chat messages: instructions, every candidate as ``[Session i]``
with its date, the question with its date, and the answer format
``<think>…</think><ranking>i, j, k</ranking>`` with 0-based ids (English or Chinese).
``PromptBuilder`` renders them with the model's own chat template and makes them fit the window:

* **Budget.** The prompt gets ``window_tokens - completion_tokens`` tokens. If the whole history
  fits, it passes through untouched. Otherwise ``coarse.select`` keeps the top-ranked sessions
  that fit; if not even one whole session fits, the coarse filter's best session is cut at a
  token boundary and ends with a visible ``[… session truncated: N tokens omitted …]`` marker.
  Choosing what to drop needs a coarse filter, so without one an overflow is an error (a lone
  session is still truncated: there is nothing to choose). The rendered prompt is counted with
  the tokenizer and is guaranteed to be within budget, or ``PromptBudgetError`` names the sizes.
* **Order.** By default candidates are shown in chronological order (stable; input order when
  any session lacks a date), the paper's rule: ids must not leak the coarse filter's opinion, or
  the proxy learns to copy it. ``order="coarse"`` shows them in the coarse filter's order, best
  first, as a prior to correct (a CPU-scale option of :class:`~memsifter.ranker.spec.PromptSpec`,
  which says which one a model was trained with). ``BuiltPrompt.coarse_order`` keeps the coarse
  ranking, as positions, for ``ParsedRanking.complete``, whenever the coarse filter ranked.
* **Thinking.** With a template that has Qwen3's ``enable_thinking`` switch the template is
  rendered with it on and the model opens ``<think>`` by itself; other (instruct) templates
  get the same instructions, which tell the model to begin its reply with ``<think>``.
* **Verbatim text, defanged control tokens.** Session texts are shown verbatim, tags included:
  injected ``<ranking>`` tags are harmless because ``parse_ranking`` reads only the model's
  output. The one exception is the tokenizer's own special tokens (``<|im_end|>``,
  ``<|im_start|>`` ...): backends tokenize the rendered text, so such a string inside a session
  would become a real control token and could close the user turn and forge an assistant one.
  ``PromptBuilder`` breaks each such occurrence with a zero-width space (``<\u200b|im_end|>``),
  which reads the same to a person and tokenizes as plain text.
* **Token ids, exact by construction.** ``BuiltPrompt.token_ids`` are the ids the prompt is
  counted by *and* sent as (``OpenAIBackend`` posts them as the completion's ``prompt``), so the
  budget can never disagree with what the server sees. They are assembled, not re-tokenized:
  the chat template is rendered once with a placeholder where the candidates go, and the prompt
  is cut into pieces that are tokenized on their own and concatenated:

      prefix (template, system, intro) | "[Session i]" | " Date: …" + turns | … | "Question: …"

  Every cut but one sits in a line break followed by text (after the intro, after each page's
  turns, after an undated label); the other sits between a label's ``]`` and the space that starts
  its date (the probe below covers it too). Byte-level BPE merges only inside the pieces its
  pre-tokenizer regex splits the text into, so a cut at a regex boundary changes no id, and where
  that boundary lies is a property of the regex. Qwen2/3's regex keeps newlines with what precedes
  them (``.\\n\\n`` is one piece), so the cut goes *after* the line break (``cut == "after"``);
  GPT-2-style regexes (SmolLM2) split a whitespace run before its last character when text
  follows, so the cut goes just *before* the break's last newline (``cut == "before"``). The
  builder tries both on a probe prompt at construction (punctuation and whitespace at page ends,
  CJK, emoji, an empty page, a turn starting with a space) and keeps the one that equals
  tokenizing the whole (``tests/test_prompt_ids.py``: on SmolLM2's tokenizer the other cut changes
  the ids). The page piece (its date, its turns and its share of the line breaks) depends on the
  page alone and is cached by content fingerprint (a history is tokenized once, at ingest in the
  recall service); labels are cached by position, so a prompt costs one render and one
  tokenization of its frame (instructions and question), reused by every assembly with as many
  candidates. A page whose turns begin with whitespace or an added token (which may strip its
  left) is tokenized together with its header. A tokenizer for which neither cut holds on the
  probe (SentencePiece adds a space at every encode), or that adds special tokens when encoding (a
  BOS the server would add to text but not to ids), gets ``token_ids = None`` (``token_ids_off``
  says why): the rendered text is counted and sent as before.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from memsifter.data.tokens import HFCounter, SessionTokenCache
from memsifter.data.types import Query, Session, Turn
from memsifter.errors import PromptBudgetError
from memsifter.ranker.parse import RANKING_OPEN, ParsedRanking

if TYPE_CHECKING:  # importing memsifter.coarse would pull bm25s into every backend import
    from memsifter.coarse.base import CoarseFilter, Selection

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


@dataclass(frozen=True)
class BuiltPrompt:
    """A rendered prompt and the bookkeeping needed to read its answer."""

    messages: list[dict[str, str]]
    text: str  # chat template applied, generation prompt included: what backends consume
    candidate_ids: tuple[str, ...]  # session ids in prompt order: position i is [Session i]
    n_tokens: int  # of ``text``, with the model's tokenizer
    budget_tokens: int  # window minus completion budget; n_tokens never exceeds it
    dropped_ids: tuple[str, ...] = ()  # left out by the coarse filter, its rank order
    truncated_ids: tuple[str, ...] = ()  # shown only in part
    coarse_order: tuple[int, ...] | None = None  # positions, coarse best first, when it ranked
    # ``text`` as the model's token ids (exactly ``tokenizer(text)`` without special tokens):
    # what n_tokens counts and what a backend that takes ids is sent. None when the tokenizer
    # fails the builder's probe (see the module doc): backends then get ``text``.
    token_ids: tuple[int, ...] | None = None

    @property
    def num_candidates(self) -> int:
        return len(self.candidate_ids)

    def session_ids(self, ranking: ParsedRanking | Sequence[int]) -> tuple[str, ...]:
        """Map a parsed ranking's positions back to session ids."""
        ids = ranking.ids if isinstance(ranking, ParsedRanking) else ranking
        return tuple(self.candidate_ids[i] for i in ids)


@dataclass(frozen=True)
class _Frame:
    """The rendered prompt around ``n`` candidate blocks: ``prefix`` (template, system message,
    intro; it ends with the blank line before the first block) and ``suffix`` (from the question
    to the generation prompt), as text and as the ids of the pieces the cut makes (see the
    module doc), so together they are the ids of the prompt without its candidates."""

    n: int
    prefix: str
    suffix: str
    prefix_ids: list[int]
    suffix_ids: list[int]

    @property
    def n_tokens(self) -> int:
        return len(self.prefix_ids) + len(self.suffix_ids)


class _WithHeader:
    """Counts a session as its prompt block: ``Session.render()`` plus the ``[Session i]`` label
    and the blank line between blocks, so ``coarse.select`` budgets what the prompt will hold."""

    def __init__(self, counter: HFCounter, extra: int) -> None:
        self.counter = counter
        self.extra = extra
        self.name = f"{counter.name}+{extra}"

    def count(self, text: str) -> int:
        return self.counter.count(text) + self.extra


_BLOCKS = "\u2063MEMSIFTER-CANDIDATES\u2063"  # where the candidates go in a rendered template
_PROBE_TEXTS = (
    "I adopted a golden retriever named Max.",
    "Trailing spaces and a list:   \n- one\n- two  ",
    "我的猫叫小白，它很喜欢睡觉。!!",
    "Code: `x = [1, 2]`\n\n\nend.\t",
    "emoji 🐕‍🦺 and 123456 digits...",
)


class PageIds:
    """Token ids of each page's prompt piece (its turns and the line break after them; see the
    module doc), keyed by content fingerprint and bounded like :class:`SessionTokenCache`
    (``max_size``, least recently used out first). ``piece`` is the text a page is cut to."""

    def __init__(self, encode: Any, piece: Any, max_size: int | None = None) -> None:
        self._encode = encode
        self.piece = piece
        self.max_size = max_size
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, session: Session) -> tuple[int, ...]:
        key = session.fingerprint
        with self._lock:  # request threads share it; an eviction must not race a hit's move
            ids = self._cache.get(key)
            if ids is not None:
                if self.max_size is not None:
                    self._cache.move_to_end(key)
                return ids
        ids = tuple(self._encode([self.piece(session)])[0])
        with self._lock:
            self._cache[key] = ids
            if self.max_size is not None and len(self._cache) > self.max_size:
                self._cache.popitem(last=False)
        return ids

    def __len__(self) -> int:
        return len(self._cache)


class PromptBuilder:
    """Builds budgeted proxy prompts for one tokenizer and window.

    ``thinking`` says whether the chat template has Qwen3's ``enable_thinking`` switch; ``None``
    detects it from the template text. ``ask_think=False`` asks for a bare ranking (and turns
    the switch off) for no-reasoning baselines.
    """

    # BPE may merge a token or two across block boundaries, so the sum of per-session counts is
    # a slightly loose estimate of the rendered prompt; this much per session is "close enough"
    # to be worth rendering the whole prompt to count it exactly.
    _SLACK_PER_SESSION = 4
    _MAX_REFITS = 8

    def __init__(
        self,
        tokenizer: Any,
        window_tokens: int,
        completion_tokens: int,
        coarse: CoarseFilter | None = None,
        language: Language = "en",
        thinking: bool | None = None,
        ask_think: bool = True,
        order: Literal["chronological", "coarse"] = "chronological",
        chat_template_kwargs: dict[str, Any] | None = None,
        ranking_head: str = "generate",
    ) -> None:
        _text(language)
        if ranking_head not in ("generate", "first_token"):
            raise ValueError(f"ranking_head must be generate or first_token, got {ranking_head!r}")
        if ranking_head == "first_token" and ask_think:
            raise ValueError("ranking_head='first_token' needs ask_think=False")
        if order not in ("chronological", "coarse"):
            raise ValueError(f"order must be chronological or coarse, got {order!r}")
        if order == "coarse" and coarse is None:
            raise ValueError("order='coarse' needs a coarse filter to order the candidates")
        if completion_tokens < 0 or window_tokens <= completion_tokens:
            raise PromptBudgetError(
                f"window_tokens ({window_tokens}) must exceed completion_tokens "
                f"({completion_tokens}) >= 0"
            )
        self.tokenizer = tokenizer
        self.window_tokens = window_tokens
        self.completion_tokens = completion_tokens
        self.budget_tokens = window_tokens - completion_tokens
        self.coarse = coarse
        self.language = language
        self.ask_think = ask_think
        self.order = order
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.ranking_head = ranking_head
        self._labels: int | None = None  # single-token labels (first_token), probed once
        template = getattr(tokenizer, "chat_template", None) or ""
        self.native_thinking = "enable_thinking" in template if thinking is None else thinking
        self.counter = HFCounter.from_tokenizer(tokenizer)
        # The widest label any realistic prompt uses, plus the blank line between blocks. Too
        # much only wastes a little room; too little is caught by the refit loop in build.
        extra = self.counter.count("[Session 99999] \n\n") + 2
        specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
        for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(added, "special", False):
                specials.add(str(added.content))
        # Longest first so a token that contains another is broken as a whole.
        self._specials = sorted((t for t in specials if len(t) > 1), key=len, reverse=True)
        # One scan of a page's joined fields finds whether any special-token string occurs at
        # all (the common answer is no); the separator is in no special token, so no match
        # spans two fields.
        self._special_re = (
            re.compile("|".join(map(re.escape, self._specials))) if self._specials else None
        )
        self._field_sep = next(c for c in "\x00\x01\x02\n" if not any(c in t for t in specials))
        # One cache per builder: a long haystack is tokenized once, not once per question.
        self.session_tokens = SessionTokenCache(_WithHeader(self.counter, extra))
        self._added = tuple(
            str(getattr(t, "content", t))
            for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
        )
        self._headers: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        # Where each piece ends (see the module doc): after a line break's last newline
        # ("after"), or just before it ("before"); the probe picks the one this tokenizer keeps.
        self.cut: Literal["after", "before"] = "after"
        self.page_ids = PageIds(self._encode, self._page_piece)
        self.token_ids_off: str | None = None  # why prompts are not built as ids, if they are not
        self.token_ids_off = self._check_token_ids()

    def _encode(self, texts: Sequence[str], special: bool = False) -> list[list[int]]:
        """Token ids of each text (fast path: no offsets computed), no special tokens added."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        fast = getattr(backend, "encode_batch_fast", None)
        if fast is not None:
            return [e.ids for e in fast(list(texts), add_special_tokens=special)]
        return [list(self.tokenizer(t, add_special_tokens=special)["input_ids"]) for t in texts]

    def _check_token_ids(self) -> str | None:
        """None if prompts may be built as ids (see the module doc), else the reason not; picks
        ``self.cut`` on the way."""
        if self._encode(["a"], special=True) != self._encode(["a"]):
            return "the tokenizer adds special tokens when encoding (the server would add them too)"
        probe = [
            Session(
                id=f"probe-{i}",
                turns=(Turn("user", text), Turn("assistant", text[::-1])),
                date_text=("8 May, 2023" + " " * (i % 3)) if i % 2 else None,
            )
            for i, text in enumerate(_PROBE_TEXTS)
        ]
        probe.append(Session(id="probe-empty", turns=()))
        probe.append(Session(id="probe-space", turns=(Turn(" lead", "x  "),)))
        question = "What did I name my dog?  \n"
        for cut in ("after", "before"):
            self.cut = cut  # type: ignore[assignment]
            try:
                ids, text, _ = self._assemble_ids(question, probe, "9 May, 2023", cache=False)
            except _NotSplittable as e:
                return str(e)
            if ids == self._encode([text])[0]:
                return None
        self.cut = "after"
        return (
            "prompt pieces tokenized apart differ from the whole prompt on a probe (cut after "
            "or before a line break's last newline)"
        )

    def _page_piece(self, session: Session) -> str:
        """A page's own piece: its header's date (a page keeps its date wherever it is shown,
        so only the ``[Session i]`` label is left to the prompt), its turns and its share of
        the line breaks around them."""
        date, turns = _dated(session, self.language), _turns(session)
        if self.cut == "after":  # an undated label keeps its newline: "]\n" is one Qwen piece
            return (date + "\n" if date else "") + turns + "\n\n"
        return date + "\n" + turns + "\n"

    def warm(self, session: Session) -> None:
        """Tokenize a page now (at ingest) so a query finds its count and ids cached."""
        session = self._defang_session(session)
        self.session_tokens(session)
        if self.token_ids_off is None:
            self.page_ids(session)

    def _header_ids(self, header: str) -> tuple[int, ...]:
        ids = self._headers.get(header)
        if ids is None:
            ids = tuple(self._encode([header])[0])
            self._remember_header(header, ids)
        return ids

    def _remember_header(self, header: str, ids: tuple[int, ...]) -> None:
        self._headers[header] = ids
        self._headers.move_to_end(header)
        if len(self._headers) > 4096:
            self._headers.popitem(last=False)

    def _frame(
        self, question: str, n: int, question_date: str | None, extra: Sequence[str] = ()
    ) -> tuple[_Frame, list[list[int]]]:
        """The prompt around ``n`` candidate blocks, and the ids of ``extra`` texts tokenized in
        the same call (a prompt's header misses)."""
        lang = self.language
        messages = _messages(question, [_BLOCKS], n, question_date, lang, self.ask_think)
        prefix, sep, suffix = self.render(messages).partition(_BLOCKS)
        if not (sep and _BLOCKS not in suffix and prefix.endswith("\n\n")):
            raise _NotSplittable("the chat template does not show the user message verbatim")
        if not suffix.startswith("\n\n"):
            raise _NotSplittable("the chat template does not show the user message verbatim")
        before = self.cut == "before"  # pieces end before a line break's last newline
        texts = [prefix[:-1], suffix[1:]] if before else [prefix, suffix[2:]]
        encoded = self._encode(texts + list(extra))
        return _Frame(n, prefix, suffix[2:], encoded[0], encoded[1]), encoded[2:]

    def _assemble_ids(
        self,
        question: str,
        ordered: Sequence[Session],
        question_date: str | None,
        cache: bool = True,
        frame: _Frame | None = None,
    ) -> tuple[list[int], str, list[str]]:
        """The prompt of ``ordered`` as token ids, as text and as its candidate blocks, built
        from cached pieces; ``frame`` is reused when it was made for as many candidates."""
        before = self.cut == "before"
        dates = [_dated(session, self.language) for session in ordered]
        headers = [_label(i) + date for i, date in enumerate(dates)]
        turns_of = [_turns(session) for session in ordered]
        # The label part of each header (its date goes with the page's cached piece), or None.
        keys: list[str | None] = []
        for i, (date, turns) in enumerate(zip(dates, turns_of, strict=True)):
            if not turns or turns[0].isspace() or turns.startswith(self._added):
                keys.append(None)  # no clean cut between header and turns: one piece
            elif before:
                keys.append("\n" + _label(i))
            else:  # an undated label keeps its newline: "]\n" is one Qwen piece
                keys.append(_label(i) + ("" if date else "\n"))
        # A label misses the cache only the first time its position is shown: encode misses in
        # the same call as the frame when there is none yet (one tokenizer call per prompt).
        missing = list(dict.fromkeys(k for k in keys if k is not None and k not in self._headers))
        if frame is None or frame.n != len(ordered):
            frame, encoded = self._frame(question, len(ordered), question_date, missing)
        else:
            encoded = self._encode(missing) if missing else []
        for key, key_ids in zip(missing, encoded, strict=True):
            self._remember_header(key, tuple(key_ids))
        ids = list(frame.prefix_ids)
        pieces = [frame.prefix]
        blocks = []
        for i, session in enumerate(ordered):
            header, turns, key = headers[i], turns_of[i], keys[i]
            if key is None:
                block = header + "\n" + turns + "\n\n"
                ids.extend(self._encode(["\n" + block[:-1] if before else block])[0])
            else:
                ids.extend(self._header_ids(key))
                if cache:
                    ids.extend(self.page_ids(session))
                else:
                    ids.extend(self._encode([self._page_piece(session)])[0])
            blocks.append(header + "\n" + turns)
            pieces += (blocks[-1], "\n\n")
        ids.extend(frame.suffix_ids)
        pieces.append(frame.suffix)
        return ids, "".join(pieces), blocks

    def defang(self, text: str) -> str:
        """``text`` with every special-token string of this tokenizer broken (see module doc)."""
        for special in self._specials:
            if special in text:
                text = text.replace(special, special[0] + "\u200b" + special[1:])
        return text

    def _has_special(self, texts: Sequence[str]) -> bool:
        return self._special_re is not None and (
            self._special_re.search(self._field_sep.join(texts)) is not None
        )

    def _defang_session(self, session: Session) -> Session:
        if not self._has_special([f for t in session.turns for f in (t.speaker, t.text)]):
            return session
        turns = tuple(
            replace(t, text=self.defang(t.text), speaker=self.defang(t.speaker))
            for t in session.turns
        )
        return replace(session, turns=turns)

    def render(self, messages: list[dict[str, str]]) -> str:
        kwargs = dict(self.chat_template_kwargs)
        if self.native_thinking:
            kwargs["enable_thinking"] = self.ask_think
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False, **kwargs
        )
        # The first-token head reads the ranking at the position after the opening tag.
        return text + RANKING_OPEN if self.ranking_head == "first_token" else text

    def build_query(self, query: Query) -> BuiltPrompt:
        return self.build(query.question, query.haystack, query.question_date)

    def build(
        self, question: str, sessions: Sequence[Session], question_date: str | None = None
    ) -> BuiltPrompt:
        if self.ranking_head != "first_token":
            return self._build(question, sessions, question_date)
        from memsifter.ranker.first_token import label_token_ids

        built = self._build(question, sessions, question_date)
        label_token_ids(self.tokenizer, built.num_candidates)  # refuses a split label
        return built

    @property
    def max_candidates(self) -> int | None:
        """At most this many candidates a prompt: the first-token head's single-token labels
        (None: no bound but the budget). More are cut by the coarse filter, as the budget is."""
        if self.ranking_head != "first_token":
            return None
        if self._labels is None:
            from memsifter.ranker.first_token import label_capacity

            self._labels = label_capacity(self.tokenizer)
        return self._labels

    def _build(
        self, question: str, sessions: Sequence[Session], question_date: str | None = None
    ) -> BuiltPrompt:
        sessions = [self._defang_session(s) for s in sessions]
        question = self.defang(question)
        if not sessions:
            raise ValueError("no candidate sessions to rank")
        ids = [s.id for s in sessions]
        if len(set(ids)) != len(ids):
            raise ValueError("candidate session ids must be unique")
        budget = self.budget_tokens
        # The prompt without candidates: with ids, the frame every assembly of this many
        # candidates reuses (rendered and tokenized once per prompt); else counted as text.
        frame = self._try_frame(question, len(sessions), question_date)
        if frame is not None:
            fixed = frame.n_tokens
        else:
            fixed = self._count_blocks(question, [], len(sessions), question_date)
        if fixed >= budget:
            raise PromptBudgetError(
                f"the instructions and question alone take {fixed} tokens, leaving no room for "
                f"sessions in the prompt budget of {budget} (window {self.window_tokens} - "
                f"completion {self.completion_tokens})"
            )

        estimate = fixed + sum(self.session_tokens(s) for s in sessions)
        cap = self.max_candidates
        if cap is not None and len(sessions) > cap and self.coarse is None:
            raise PromptBudgetError(
                f"{len(sessions)} candidates but this tokenizer has {cap} single-token labels "
                "for ranking_head: first_token; pass a coarse filter to choose which to keep"
            )
        fits = cap is None or len(sessions) <= cap
        if fits and estimate <= budget + self._SLACK_PER_SESSION * len(sessions):
            if self.order == "coarse" and len(sessions) > 1:
                # Everything fits, but the coarse filter still orders what is shown.
                ranked = self.coarse.score(question, sessions)  # type: ignore[union-attr]
                by_id = {s.id: s for s in sessions}
                ordered = [by_id[sid] for sid in ranked.ids]
                built = self._assemble(
                    question, ordered, question_date, ranking=ranked, frame=frame
                )
            else:
                built = self._assemble(
                    question, _chronological(sessions, ids), question_date, frame=frame
                )
            if built.n_tokens <= budget:
                return built

        if self.coarse is None:
            if len(sessions) == 1:
                return self._truncated(question, sessions[0], question_date, fixed)
            raise PromptBudgetError(
                f"{len(sessions)} sessions need about {estimate} prompt tokens but the budget is "
                f"{budget} (window {self.window_tokens} - completion {self.completion_tokens}); "
                "pass a coarse filter to choose which sessions to keep"
            )

        session_budget = budget - fixed
        for _ in range(self._MAX_REFITS):
            selection = self.coarse.select(
                question, sessions, session_budget, self.session_tokens, max_sessions=cap
            )
            if not selection.sessions:
                return self._truncated_top(question, sessions, selection, question_date, fixed)
            kept = {s.id for s in selection.sessions}
            if self.order == "coarse" and selection.ranking is not None:
                by_id = {s.id: s for s in sessions}
                ordered = [by_id[sid] for sid in selection.ranking.ids if sid in kept]
            else:
                ordered = _chronological([s for s in sessions if s.id in kept], ids)
            built = self._assemble(question, ordered, question_date, selection, frame=frame)
            if built.n_tokens <= budget:
                return built
            session_budget -= built.n_tokens - budget
        raise PromptBudgetError(
            f"could not fit the prompt into {budget} tokens after {self._MAX_REFITS} attempts "
            f"(last try: {built.n_tokens} tokens)"
        )

    def _try_frame(self, question: str, n: int, question_date: str | None) -> _Frame | None:
        """The frame when prompts are built as ids; None when they are not, or when this
        question cannot be cut out of the template (it holds the placeholder itself)."""
        if self.token_ids_off is not None:
            return None
        try:
            return self._frame(question, n, question_date)[0]
        except _NotSplittable:
            return None

    def _count_blocks(
        self, question: str, blocks: Sequence[str], n: int, question_date: str | None
    ) -> int:
        messages = _messages(question, blocks, n, question_date, self.language, self.ask_think)
        return self.counter.count(self.render(messages))

    def _assemble(
        self,
        question: str,
        ordered: Sequence[Session],
        question_date: str | None,
        selection: Selection | None = None,
        blocks: Sequence[str] | None = None,
        truncated_ids: tuple[str, ...] = (),
        dropped_ids: tuple[str, ...] | None = None,
        ranking: Any = None,
        frame: _Frame | None = None,
    ) -> BuiltPrompt:
        token_ids: list[int] | None = None
        if blocks is None and self.token_ids_off is None:
            try:
                token_ids, text, blocks = self._assemble_ids(
                    question, ordered, question_date, frame=frame
                )
            except _NotSplittable:  # the question holds the placeholder: tokenize the whole
                pass
        if blocks is None:
            blocks = [_block(i, s, self.language) for i, s in enumerate(ordered)]
        messages = _messages(
            question, blocks, len(ordered), question_date, self.language, self.ask_think
        )
        if token_ids is None:
            text = self.render(messages)
            if self.token_ids_off is None:
                token_ids = self._encode([text])[0]  # a truncated block: tokenized whole
        position = {s.id: i for i, s in enumerate(ordered)}
        if ranking is None:
            ranking = selection.ranking if selection is not None else None
        coarse_order = (
            tuple(position[sid] for sid in ranking.ids if sid in position) if ranking else None
        )
        if dropped_ids is None:
            dropped_ids = selection.dropped_ids if selection is not None else ()
        return BuiltPrompt(
            messages=messages,
            text=text,
            candidate_ids=tuple(position),
            n_tokens=len(token_ids) if token_ids is not None else self.counter.count(text),
            budget_tokens=self.budget_tokens,
            dropped_ids=dropped_ids,
            truncated_ids=truncated_ids,
            coarse_order=coarse_order,
            token_ids=tuple(token_ids) if token_ids is not None else None,
        )

    def _truncated_top(
        self,
        question: str,
        sessions: Sequence[Session],
        selection: Selection,
        question_date: str | None,
        fixed: int,
    ) -> BuiltPrompt:
        # select keeps nothing only when it had to rank, so its ranking is there.
        ranking = selection.ranking
        top_id = ranking.ids[0] if ranking else sessions[0].id
        top = next(s for s in sessions if s.id == top_id)
        order = ranking.ids if ranking else tuple(s.id for s in sessions)
        dropped = tuple(sid for sid in order if sid != top_id)
        return self._truncated(question, top, question_date, fixed, dropped)

    def _truncated(
        self,
        question: str,
        session: Session,
        question_date: str | None,
        fixed: int,
        dropped_ids: tuple[str, ...] = (),
    ) -> BuiltPrompt:
        """The prompt with ``session`` alone, its turns cut at a token boundary to fit."""
        budget = self.budget_tokens
        tok = self.tokenizer
        header = _header(0, session, self.language)
        marker = _text(self.language)["truncated"]
        pieces = tok(_turns(session), add_special_tokens=False)["input_ids"]
        total = len(pieces)

        def assemble(keep: int) -> BuiltPrompt:
            if keep >= total:
                body, cut = _turns(session), ()
            else:
                # A cut inside a multi-byte character decodes to U+FFFD; drop that half
                # character rather than show a replacement glyph.
                kept = tok.decode(
                    pieces[:keep], skip_special_tokens=False, clean_up_tokenization_spaces=False
                ).rstrip("\ufffd")
                body = f"{kept}\n{marker.format(n=total - keep)}".lstrip("\n")
                cut = (session.id,)
            return self._assemble(
                question,
                [session],
                question_date,
                blocks=[f"{header}\n{body}"],
                truncated_ids=cut,
                dropped_ids=dropped_ids,
            )

        keep = min(total, budget - assemble(0).n_tokens)
        for _ in range(self._MAX_REFITS):
            if keep < 1 and total:
                break
            built = assemble(keep)
            if built.n_tokens <= budget:
                return built
            keep -= built.n_tokens - budget
        raise PromptBudgetError(
            f"session {session.id!r} cannot be shown even in part: the instructions, question "
            f"and truncation marker take over {budget} tokens (window {self.window_tokens} - "
            f"completion {self.completion_tokens}; instructions and question alone: {fixed})"
        )


class _NotSplittable(ValueError):
    """The rendered prompt cannot be cut into independently tokenized pieces."""


def _chronological(sessions: Sequence[Session], input_order: Sequence[str]) -> list[Session]:
    """Oldest first, ties in input order; input order throughout when a date is missing, since
    an undated session has no place in the timeline."""
    rank = {sid: i for i, sid in enumerate(input_order)}
    by_input = sorted(sessions, key=lambda s: rank[s.id])
    if any(s.date is None for s in by_input):
        return by_input
    return sorted(by_input, key=lambda s: _comparable(s.date))  # type: ignore[arg-type]


def _comparable(value: datetime) -> datetime:
    # Aware and naive datetimes cannot be compared; read naive ones as UTC.
    if value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)
