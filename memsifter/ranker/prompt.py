"""The one prompt builder for the proxy: training, evaluation and serving all build through here,
so the model is served exactly the prompt it was trained on.

``build_messages`` (from :mod:`~memsifter.ranker.messages`) writes the chat messages:
instructions, every candidate as ``[Session i]`` with its date, the question with its date, and
the answer format ``<think>…</think><ranking>i, j, k</ranking>`` with 0-based ids (English or
Chinese; ids in digits, or for the first-token head in letters, ``[Session A]``).
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
  ``order="newest_first"`` is the chronological order reversed (the same blocks, mirrored).
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
  counted by *and* sent as, assembled from pieces tokenized apart rather than re-tokenized;
  :mod:`memsifter.ranker.prompt_ids` says how, and when a tokenizer gets ``token_ids = None``.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from memsifter.data.tokens import HFCounter, SessionTokenCache
from memsifter.data.types import Query, Session
from memsifter.errors import DataError, PromptBudgetError
from memsifter.ranker.messages import (
    CLOSER_OPEN,
    LANGUAGES,
    MARKED_LAYOUTS,
    TEMPLATES,
    Labelling,
    Language,
    Layout,
    _block,
    _closed,
    _header,
    _messages,
    _text,
    _turns,
    build_messages,
    check_labelling,
    check_layout,
    labelling_size,
    restated_line,
)
from memsifter.ranker.parse import RANKING_OPEN, ParsedRanking
from memsifter.ranker.prompt_ids import PageIds, PromptIdAssembly, _Frame, _NotSplittable

if TYPE_CHECKING:  # importing memsifter.coarse would pull bm25s into every backend import
    from memsifter.coarse.base import CoarseFilter, Selection

__all__ = ["LANGUAGES", "BuiltPrompt", "Language", "PromptBuilder", "build_messages"]


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
    # fails the builder's probe (see memsifter.ranker.prompt_ids): backends then get ``text``.
    token_ids: tuple[int, ...] | None = None

    @property
    def num_candidates(self) -> int:
        return len(self.candidate_ids)

    def session_ids(self, ranking: ParsedRanking | Sequence[int]) -> tuple[str, ...]:
        """Map a parsed ranking's positions back to session ids."""
        ids = ranking.ids if isinstance(ranking, ParsedRanking) else ranking
        return tuple(self.candidate_ids[i] for i in ids)


class _WithHeader:
    """Counts a session as its prompt block: ``Session.render()`` plus the ``[Session i]`` label
    and the blank line between blocks, so ``coarse.select`` budgets what the prompt will hold."""

    def __init__(self, counter: HFCounter, extra: int) -> None:
        self.counter = counter
        self.extra = extra
        self.name = f"{counter.name}+{extra}"

    def count(self, text: str) -> int:
        return self.counter.count(text) + self.extra


class PromptBuilder(PromptIdAssembly):
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
        order: Literal["chronological", "newest_first", "coarse"] = "chronological",
        chat_template_kwargs: dict[str, Any] | None = None,
        ranking_head: str = "generate",
        labels: Labelling = "digits",
        layout: Layout = "paper",
        head_read: str = "label",
        rank_all: bool = False,
        template: str = "memsifter",
    ) -> None:
        """``rank_all``: the coarse filter ranks the candidates of every prompt, also when all
        fit and they are shown by date, so each prompt carries its ``coarse_order`` (what a spec
        with ``coarse_weight`` fuses with the head's scores)."""
        _text(language)
        check_labelling(labels)
        check_layout(layout)
        if labels != "digits" and ranking_head != "first_token":
            raise ValueError(f"labels={labels!r} needs ranking_head='first_token'")
        if ranking_head not in ("generate", "first_token"):
            raise ValueError(f"ranking_head must be generate or first_token, got {ranking_head!r}")
        if ranking_head == "first_token" and ask_think:
            raise ValueError("ranking_head='first_token' needs ask_think=False")
        from memsifter.ranker.first_token import HEAD_READS

        if head_read not in HEAD_READS:
            raise ValueError(f"head_read must be one of {HEAD_READS}, got {head_read!r}")
        if head_read == "marker" and (
            ranking_head != "first_token" or layout not in MARKED_LAYOUTS
        ):
            raise ValueError(
                "head_read='marker' needs ranking_head='first_token' and layout 'marked' or "
                f"'restated' (got {ranking_head!r}, {layout!r})"
            )
        if order not in ("chronological", "newest_first", "coarse"):
            raise ValueError(f"order must be chronological, newest_first or coarse, got {order!r}")
        if order == "coarse" and coarse is None:
            raise ValueError("order='coarse' needs a coarse filter to order the candidates")
        if template not in TEMPLATES:
            raise ValueError(f"template must be one of {TEMPLATES}, got {template!r}")
        if rank_all and coarse is None:
            raise ValueError("rank_all needs a coarse filter to rank the candidates")
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
        self.labels = labels
        self.layout = layout
        self.head_read = head_read
        self.rank_all = rank_all
        self.template = template
        self._labels: int | None = None  # single-token labels (first_token), probed once
        if ranking_head == "first_token" and head_read == "label" and not self.max_candidates:
            from memsifter.ranker.first_token import check_label_capacity

            check_label_capacity(tokenizer, 1, labels)  # refused now, naming why, not per build
        chat_template = getattr(tokenizer, "chat_template", None) or ""
        if self.template == "official" and not chat_template:
            where = getattr(tokenizer, "name_or_path", None) or "the model's folder"
            raise DataError(
                "template: official renders the released model's prompt with the model's own "
                f"chat template, and the tokenizer of {where} has none (tokenizer_config.json's "
                "chat_template, or chat_template.jinja)",
                file=str(where),
            )
        if self.template == "official":
            from memsifter.ranker.official import check_released_folder

            check_released_folder(tokenizer)
        self.native_thinking = "enable_thinking" in chat_template if thinking is None else thinking
        self.counter = HFCounter.from_tokenizer(tokenizer)
        # The widest label any realistic prompt uses, plus the blank line between blocks. Too
        # much only wastes a little room; too little is caught by the refit loop in build.
        marked = layout in MARKED_LAYOUTS
        widest = "[Session 99999] \n\n" + ("\n[End of Session 99999]" if marked else "")
        extra = self.counter.count(widest) + 2
        specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
        for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(added, "special", False):
                specials.add(str(added.content))
        if marked:
            # A session's text cannot forge a closing marker: the marker read finds each
            # candidate's score at its own closer, so the closers must be the builder's alone.
            specials.add(CLOSER_OPEN)
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
        # Where each piece ends (see prompt_ids' module doc): after a line break's last newline
        # ("after"), or just before it ("before"); the probe picks the one this tokenizer keeps.
        self.cut: Literal["after", "before"] = "after"
        self.page_ids = PageIds(self._encode, self._page_piece)
        self.token_ids_off: str | None = None  # why prompts are not built as ids, if they are not
        self.token_ids_off = (
            # The released model's prompt is rendered as text: its blocks are not ours.
            "template: official renders the released model's prompt as text"
            if self.template == "official"
            else self._check_token_ids()
        )

    def warm(self, session: Session) -> None:
        """Tokenize a page now (at ingest) so a query finds its count and ids cached."""
        session = self._defang_session(session)
        self.session_tokens(session)
        if self.token_ids_off is None:
            self.page_ids(session)

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
        if self.native_thinking and self.template != "official":  # it was trained without one
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
        if self.ranking_head != "first_token" or self.head_read == "marker":
            return self._build(question, sessions, question_date)
        from memsifter.ranker.first_token import label_token_ids

        built = self._build(question, sessions, question_date)
        label_token_ids(self.tokenizer, built.num_candidates, self.labels)  # refuses a split label
        return built

    def build_shown(
        self, question: str, sessions: Sequence[Session], question_date: str | None = None
    ) -> BuiltPrompt:
        """``sessions`` shown in exactly this order, none cut or reordered: a prompt that was
        built earlier (its candidates, as an RL row keeps them) rendered again under another
        order, for the order-invariance check (:mod:`memsifter.evaluation.invariance`). The
        blocks are the ones :meth:`build` writes, so the identity order renders the original
        prompt and any order holds the same blocks under other labels."""
        if not sessions:
            raise ValueError("no candidate sessions to show")
        sessions = [self._defang_session(s) for s in sessions]
        question = self.defang(question)
        frame = self._try_frame(question, len(sessions), question_date)
        return self._assemble(question, sessions, question_date, frame=frame)

    @property
    def max_candidates(self) -> int | None:
        """At most this many candidates a prompt: the first-token head's single-token labels
        (None: no bound but the budget). More are cut by the coarse filter, as the budget is."""
        if self.ranking_head != "first_token":
            return None
        if self.head_read == "marker":  # read at markers: labels need not be single tokens
            return labelling_size(self.labels)
        if self._labels is None:
            from memsifter.ranker.first_token import label_capacity

            self._labels = label_capacity(self.tokenizer, self.labels)
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
        # Letters run out at 52: the frame is the one of as many as the labelling can show
        # (digits never run out, and keep the count they always had).
        size = labelling_size(self.labels)
        n_frame = len(sessions) if size is None else min(len(sessions), size)
        frame = self._try_frame(question, n_frame, question_date)
        if frame is not None:
            fixed = frame.n_tokens
        else:
            fixed = self._count_blocks(question, [], n_frame, question_date)
        if fixed >= budget:
            raise PromptBudgetError(
                f"the instructions and question alone take {fixed} tokens, leaving no room for "
                f"sessions in the prompt budget of {budget} (window {self.window_tokens} - "
                f"completion {self.completion_tokens})"
            )

        # ``restated`` shows the question again in every block: a cost per block that depends
        # on the question, added to every page's cached count (the pages are not counted again).
        tokens = self.session_tokens
        if self.layout == "restated":
            tokens = tokens.plus(self.counter.count(restated_line(question, self.language)) + 1)
        estimate = fixed + sum(tokens(s) for s in sessions)
        cap = self.max_candidates
        if cap is not None and len(sessions) > cap and self.coarse is None:
            kind = "digit" if self.labels == "digits" else "letter"
            raise PromptBudgetError(
                f"{len(sessions)} candidates but this tokenizer has {cap} single-token {kind} "
                f"labels for ranking_head: first_token (labels: {self.labels}); pass a coarse "
                "filter to choose which to keep"
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
                ranked = (
                    self.coarse.score(question, sessions)  # type: ignore[union-attr]
                    if self.rank_all and len(sessions) > 1
                    else None
                )
                built = self._assemble(
                    question,
                    self._dated(sessions, ids),
                    question_date,
                    ranking=ranked,
                    frame=frame,
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
                question, sessions, session_budget, tokens, max_sessions=cap
            )
            if not selection.sessions:
                return self._truncated_top(question, sessions, selection, question_date, fixed)
            kept = {s.id for s in selection.sessions}
            if self.order == "coarse" and selection.ranking is not None:
                by_id = {s.id: s for s in sessions}
                ordered = [by_id[sid] for sid in selection.ranking.ids if sid in kept]
            else:
                ordered = self._dated([s for s in sessions if s.id in kept], ids)
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
        return self.counter.count(
            self.render(self._messages_of(question, blocks, n, question_date))
        )

    def _dated(self, sessions: Sequence[Session], input_order: Sequence[str]) -> list[Session]:
        """``sessions`` in the spec's date order: oldest first, or with ``newest_first`` the
        same timeline reversed."""
        return chronological(sessions, input_order, newest_first=self.order == "newest_first")

    def _blocks_of(self, question: str, ordered: Sequence[Session]) -> list[str]:
        """The candidates' prompt blocks, in the spec's template."""
        if self.template == "official":
            from memsifter.ranker.official import session_blocks

            return session_blocks(ordered)
        restated = restated_line(question, self.language)
        return [
            _block(i, s, self.language, self.labels, self.layout, restated)
            for i, s in enumerate(ordered)
        ]

    def _messages_of(
        self, question: str, blocks: Sequence[str], n: int, question_date: str | None
    ) -> list[dict[str, str]]:
        """The chat messages around the blocks, in the spec's template (the released model's
        reads no question date)."""
        if self.template == "official":
            from memsifter.ranker.official import messages_from_blocks

            return messages_from_blocks(question, blocks)
        return _messages(
            question,
            blocks,
            n,
            question_date,
            self.language,
            self.ask_think,
            self.labels,
            self.layout,
        )

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
            blocks = self._blocks_of(question, ordered)
        messages = self._messages_of(question, blocks, len(ordered), question_date)
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
        if self.template == "official":
            raise PromptBudgetError(
                f"session {session.id!r} alone exceeds the prompt budget of {budget} tokens, and "
                "the released model's prompt (template: official) shows whole sessions only"
            )
        tok = self.tokenizer
        header = _header(0, session, self.language, self.labels)
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
                blocks=[
                    _closed(
                        f"{header}\n{body}",
                        0,
                        self.labels,
                        self.layout,
                        restated_line(question, self.language),
                    )
                ],
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


def chronological(
    sessions: Sequence[Session], input_order: Sequence[str], newest_first: bool = False
) -> list[Session]:
    """Oldest first (``newest_first``: reversed), ties in input order; input order throughout
    when a date is missing, since an undated session has no place in the timeline."""
    rank = {sid: i for i, sid in enumerate(input_order)}
    by_input = sorted(sessions, key=lambda s: rank[s.id])
    if not any(s.date is None for s in by_input):
        by_input.sort(key=lambda s: _comparable(s.date))  # type: ignore[arg-type]
    # ``newest_first`` is the same timeline read backwards (ties too), so the two orders of a
    # prompt are exact mirrors.
    return by_input[::-1] if newest_first else by_input


def _comparable(value: datetime) -> datetime:
    # Aware and naive datetimes cannot be compared; read naive ones as UTC.
    if value.tzinfo is None:
        return value
    return value.astimezone(timezone.utc).replace(tzinfo=None)
