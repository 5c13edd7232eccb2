"""The proxy prompt as token ids, assembled from pieces tokenized apart.

**Token ids, exact by construction.** ``BuiltPrompt.token_ids`` are the ids the prompt is
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
tokenizing the whole (``tests/ranker/test_prompt_ids.py``: on SmolLM2's tokenizer the other cut
changes the ids). The page piece (its date, its turns and its share of the line breaks) depends on
the page alone and is cached by content fingerprint (a history is tokenized once, at ingest in the
recall service); labels are cached by position, so a prompt costs one render and one
tokenization of its frame (instructions and question), reused by every assembly with as many
candidates. A page whose turns begin with whitespace or an added token (which may strip its
left) is tokenized together with its header. A tokenizer for which neither cut holds on the
probe (SentencePiece adds a space at every encode), or that adds special tokens when encoding (a
BOS the server would add to text but not to ids), gets ``token_ids = None`` (``token_ids_off``
says why): the rendered text is counted and sent as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memsifter.data.types import Session, Turn
from memsifter.ranker.messages import (
    MARKED_LAYOUTS,
    _closed,
    _dated,
    _label,
    _messages,
    _trailer,
    _turns,
    restated_line,
)
from memsifter.scopes import ScopedKey, scoped

_BLOCKS = "\u2063MEMSIFTER-CANDIDATES\u2063"  # where the candidates go in a rendered template
_PROBE_TEXTS = (
    "I adopted a golden retriever named Max.",
    "Trailing spaces and a list:   \n- one\n- two  ",
    "我的猫叫小白，它很喜欢睡觉。!!",
    "Code: `x = [1, 2]`\n\n\nend.\t",
    "emoji 🐕‍🦺 and 123456 digits...",
)


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


class _NotSplittable(ValueError):
    """The rendered prompt cannot be cut into independently tokenized pieces."""


class PageIds:
    """Token ids of each page's prompt piece (its turns and the line break after them; see the
    module doc), keyed by content fingerprint, and by the ``cache_scope`` in force
    (``memsifter.scopes``), and bounded like :class:`SessionTokenCache` (``max_size`` over every
    scope, least recently used out first). ``piece`` is the text a page is cut to."""

    def __init__(self, encode: Any, piece: Any, max_size: int | None = None) -> None:
        self._encode = encode
        self.piece = piece
        self.max_size = max_size
        self._cache: OrderedDict[ScopedKey, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, session: Session) -> tuple[int, ...]:
        key = scoped(session.fingerprint)
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


class PromptIdAssembly:
    """The token-id half of :class:`~memsifter.ranker.prompt.PromptBuilder`: tokenizing, the
    probe that picks the cut, the cached pieces and their assembly into a prompt's ids. The
    builder sets the attributes below in its constructor and supplies ``render``."""

    tokenizer: Any
    language: str
    ask_think: bool
    labels: str  # how candidate ids are written: digits | letters
    layout: str  # paper | marked (question first, every session closed by its id) | restated
    cut: Literal["after", "before"]
    page_ids: PageIds
    _added: tuple[str, ...]
    _headers: OrderedDict[str, tuple[int, ...]]

    def render(self, messages: list[dict[str, str]]) -> str:
        """The chat template applied to ``messages``: the builder's, which owns the template."""
        raise NotImplementedError

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
        # Under ``marked`` the page ends at the line break before its closing id, which is a
        # piece of its own (see _assemble_ids): one newline here instead of the blank line.
        marked = self.layout in MARKED_LAYOUTS
        if self.cut == "after":  # an undated label keeps its newline: "]\n" is one Qwen piece
            return (date + "\n" if date else "") + turns + ("\n" if marked else "\n\n")
        return date + "\n" + turns + ("" if marked else "\n")

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
        messages = _messages(
            question, [_BLOCKS], n, question_date, lang, self.ask_think, self.labels, self.layout
        )
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
        headers = [_label(i, self.labels) + date for i, date in enumerate(dates)]
        turns_of = [_turns(session) for session in ordered]
        # The label part of each header (its date goes with the page's cached piece), or None.
        keys: list[str | None] = []
        for i, (date, turns) in enumerate(zip(dates, turns_of, strict=True)):
            if not turns or turns[0].isspace() or turns.startswith(self._added):
                keys.append(None)  # no clean cut between header and turns: one piece
            elif before:
                keys.append("\n" + _label(i, self.labels))
            else:  # an undated label keeps its newline: "]\n" is one Qwen piece
                keys.append(_label(i, self.labels) + ("" if date else "\n"))
        # A label misses the cache only the first time its position is shown: encode misses in
        # the same call as the frame when there is none yet (one tokenizer call per prompt).
        missing = list(dict.fromkeys(k for k in keys if k is not None and k not in self._headers))
        # ``restated``: the question's line before every closing id, one piece of this prompt's
        # own (cut at the line breaks around it, as the closer is), encoded in the same call.
        restated = restated_line(question, self.language) if self.layout == "restated" else ""
        extra = [*missing, f"\n{restated}" if before else f"{restated}\n"] if restated else missing
        if frame is None or frame.n != len(ordered):
            frame, encoded = self._frame(question, len(ordered), question_date, extra)
        else:
            encoded = self._encode(extra) if extra else []
        restated_ids = encoded.pop() if restated else []
        for key, key_ids in zip(missing, encoded, strict=True):
            self._remember_header(key, tuple(key_ids))
        ids = list(frame.prefix_ids)
        pieces = [frame.prefix]
        blocks = []
        marked = self.layout in MARKED_LAYOUTS
        for i, session in enumerate(ordered):
            header, turns, key = headers[i], turns_of[i], keys[i]
            shown = _closed(header + "\n" + turns, i, self.labels, self.layout, restated)
            if key is None:
                block = shown + "\n\n"
                ids.extend(self._encode(["\n" + block[:-1] if before else block])[0])
            else:
                ids.extend(self._header_ids(key))
                if cache:
                    ids.extend(self.page_ids(session))
                else:
                    ids.extend(self._encode([self._page_piece(session)])[0])
                if marked:  # the closing id, cached by position like the label
                    ids.extend(restated_ids)
                    trailer = _trailer(i, self.labels)
                    ids.extend(self._header_ids(f"\n{trailer}\n" if before else f"{trailer}\n\n"))
            blocks.append(shown)
            pieces += (blocks[-1], "\n\n")
        ids.extend(frame.suffix_ids)
        pieces.append(frame.suffix)
        return ids, "".join(pieces), blocks
