"""The prompt contract: everything that decides the proxy's prompt, declared once.

A proxy only works on the prompt it was trained on: the same tokenizer and chat template, window
and completion budget, language, whether it is asked to think, what a candidate is (a session or
a page of a few turns), the coarse filter that cuts and orders candidates, and the order they are
shown in. :class:`PromptSpec` holds exactly that. The RL data recipe embeds one
(``configs/data/*.yaml``, key ``prompt``); ``memsifter data rl`` writes it next to the data as
``prompt_spec.json``; training copies it into every checkpoint and the shipped adapter; validation,
``memsifter eval`` and the recall service read it back from the model folder and build their
:class:`~memsifter.ranker.prompt.PromptBuilder` from it. :class:`PromptBuilder` stays the only
renderer, so a checkpoint is served byte-identical prompts to the ones it was trained on.

The file, and which spec a model is shown (its own, or explicit settings for a model without
one), belong to :mod:`memsifter.ranker.checkpoint`.

**Candidate order.** ``chronological`` (the paper's rule): ids are dates order, so they never
leak the coarse filter's opinion. ``coarse``: candidates are shown in the coarse filter's order,
best first, as a prior for the proxy to correct. It is our CPU-scale option: a 135M model
trained for minutes on 2 cores cannot learn relevance from scratch, but it can learn when to
move a candidate ahead of the coarse filter's choice. ``newest_first``: dates order reversed, so
ids still leak nothing of the coarse filter, and a causal model's read of a candidate has seen
every *newer* session (what "the latest", "before X" and "in force when" are decided by) instead
of every older one (docs/gym.md, finding 26). Whichever is used is part of the spec and is served
the same way.

**Ranking head.** ``generate`` (the paper's form): the proxy writes
``<think>…</think><ranking>…</ranking>`` and the parser reads it. ``first_token``: the prompt
ends right after ``<ranking>``, and the logits at that one position over the candidates' labels
are the ranking (:mod:`memsifter.ranker.first_token`): one prefill, no decode, nothing to parse.
Thinking is off in that mode (``ask_think: false``), and every label must be one token.

**Labels.** How a candidate's id is written (:mod:`memsifter.ranker.messages`): ``digits``
(``[Session 0]`` …, the default) or ``letters`` (``[Session A]`` … ``[Session z]``, 52). The
head reads one token per label, and Qwen3's and SmolLM2's tokenizers split numbers into digits,
so with ``digits`` it ranks at most 10 candidates; ``letters`` lets one prefill rank 52. The
parser of ``generate`` reads numbers, so ``letters`` is refused with it (:class:`DataError`).
A ``digits`` spec leaves the key out of :meth:`PromptSpec.to_dict`, so its ``prompt_spec.json``
is byte-identical to one written before labellings existed.

**Head read.** Where the first-token head reads each candidate's score. ``label`` (the default,
left out of ``to_dict``): every score at the one position after ``<ranking>``, the logit of the
candidate's label token, so the last position must *point* at the right id. ``marker`` (with
``layout: marked``): candidate i's score is the logit of one fixed token (:data:`~memsifter.
ranker.first_token.MARKER_TOKEN`) at the last token of its own closing marker
``[End of Session D]``, a position that has read the question and that session. Still one
prefill and the same Plackett–Luce policy over the scores, but each score is a per-session
judgement instead of a pointer, and labels need not be single tokens (no capacity limit).
The reading gym found that SmolLM2 learns the marker read where it never learned to point
(docs/gym.md, finding 14).

**Layout.** ``paper`` (the default, left out of ``to_dict`` like ``digits``): the sessions, then
the question. ``marked``: the question first and every session closed by its id, so the label
token the head scores sits after the question and its session (:mod:`memsifter.ranker.messages`).
``restated``: ``marked`` with the question again on the line before every closing id, so the
marker read's position has the question a line away (docs/gym.md, finding 22).

**Template.** ``memsifter`` (ours, the default, left out of ``to_dict``) or ``official``: the
released MemSifter proxy's training prompt and parse rules, byte for byte
(:mod:`memsifter.ranker.official`; docs/official_proxy.md), so the authors' checkpoint is shown
the prompt it was trained on. It fixes what that prompt is: sessions, English, thinking, a
written ranking; the window, the coarse filter and the order stay the spec's.

**Coarse weight.** ``coarse_weight: λ`` (first-token head only; 0, the default, is left out of
``to_dict``): every score becomes the head's own plus λ times the coarse prior ``−ln(1 + rank)``
(:mod:`memsifter.ranker.coarse_prior`), so the coarse opinion is a feature of each candidate
rather than its position, an untrained head with a large λ ranks as the coarse filter does, and
training learns the residual. The builder then always ranks the candidates with the coarse
filter, whatever order shows them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from memsifter.errors import DataError

if TYPE_CHECKING:
    from memsifter.coarse.base import CoarseFilter
    from memsifter.ranker.parse import ParsedRanking
    from memsifter.ranker.prompt import PromptBuilder

CandidateOrder = Literal["chronological", "newest_first", "coarse"]
CANDIDATE_ORDERS: tuple[str, ...] = ("chronological", "newest_first", "coarse")
RANKING_HEADS: tuple[str, ...] = ("generate", "first_token")
DEFAULT_LABELS = "digits"
DEFAULT_LAYOUT = "paper"
DEFAULT_HEAD_READ = "label"
DEFAULT_COARSE_WEIGHT = 0.0
DEFAULT_TEMPLATE = "memsifter"


@dataclass(frozen=True)
class PromptSpec:
    """What the proxy's prompt is made of; see the module doc."""

    model: str = "smollm2-135m-instruct"  # whose tokenizer and chat template render the prompt
    window_tokens: int = 8192  # prompt + completion
    completion_tokens: int = 1024  # reserved for the answer; also the generation cap
    language: str = "en"  # en | zh
    ask_think: bool = True  # ask for <think>…</think> before the ranking
    unit: str = "session"  # session | page
    turns_per_page: int = 4  # with unit: page
    coarse: str = "bm25"  # the coarse filter that cuts (and with order: coarse, orders)
    order: str = "chronological"  # chronological | newest_first | coarse
    ranking_head: str = "generate"  # generate | first_token (see the module doc)
    labels: str = DEFAULT_LABELS  # digits | letters: how candidate ids are written (module doc)
    # paper | marked (question first, sessions closed by their id) | restated (and the question
    # again before each closing id)
    layout: str = DEFAULT_LAYOUT
    head_read: str = DEFAULT_HEAD_READ  # label | marker: where the head reads a score (module doc)
    # λ of the head's score + λ · the coarse prior (memsifter.ranker.coarse_prior); 0: the head
    # alone, left out of to_dict like the other defaults
    coarse_weight: float = DEFAULT_COARSE_WEIGHT
    # memsifter | official: whose prompt and parse rules (the released model's: memsifter.ranker.
    # official); the default is left out of to_dict
    template: str = DEFAULT_TEMPLATE
    # Extra chat-template arguments; Qwen3's enable_thinking is derived from ask_think.
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from memsifter.data.units import UNITS
        from memsifter.ranker.prompt import LANGUAGES

        if self.completion_tokens < 0 or self.window_tokens <= self.completion_tokens:
            raise ValueError(
                f"window_tokens ({self.window_tokens}) must exceed completion_tokens "
                f"({self.completion_tokens}) >= 0"
            )
        if self.language not in LANGUAGES:
            raise ValueError(f"language must be one of {LANGUAGES}, got {self.language!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")
        if self.turns_per_page < 1:
            raise ValueError(f"turns_per_page must be >= 1, got {self.turns_per_page}")
        if self.order not in CANDIDATE_ORDERS:
            raise ValueError(f"order must be one of {CANDIDATE_ORDERS}, got {self.order!r}")
        if self.ranking_head not in RANKING_HEADS:
            raise ValueError(
                f"ranking_head must be one of {RANKING_HEADS}, got {self.ranking_head!r}"
            )
        if self.ranking_head == "first_token" and self.ask_think:
            raise ValueError(
                "ranking_head: first_token reads the ranking at the position right after "
                "<ranking>, so there is no reasoning before it: set ask_think: false"
            )
        from memsifter.ranker.messages import LABELLINGS, LAYOUTS, MARKED_LAYOUTS

        if self.labels not in LABELLINGS:
            raise ValueError(f"labels must be one of {LABELLINGS}, got {self.labels!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        from memsifter.ranker.first_token import HEAD_READS

        if self.head_read not in HEAD_READS:
            raise ValueError(f"head_read must be one of {HEAD_READS}, got {self.head_read!r}")
        if self.head_read == "marker" and (
            self.ranking_head != "first_token" or self.layout not in MARKED_LAYOUTS
        ):
            raise ValueError(
                "head_read: marker scores each candidate at its own closing marker "
                "([End of Session D]), so it needs ranking_head: first_token and layout: marked "
                "or restated "
                f"(got ranking_head: {self.ranking_head}, layout: {self.layout})"
            )
        if self.labels != DEFAULT_LABELS and self.ranking_head != "first_token":
            raise ValueError(
                f"labels: {self.labels} needs ranking_head: first_token; ranking_head: "
                f"{self.ranking_head} has the model write its ranking, and the parser reads "
                "numeric ids"
            )
        if not (self.coarse_weight >= 0 and self.coarse_weight < float("inf")):
            raise ValueError(
                f"coarse_weight must be a finite number >= 0, got {self.coarse_weight}"
            )
        if self.coarse_weight and self.ranking_head != "first_token":
            raise ValueError(
                f"coarse_weight: {self.coarse_weight} adds the coarse prior to the head's scores, "
                f"so it needs ranking_head: first_token (got {self.ranking_head}: the model "
                "writes its ranking, with no score to fuse)"
            )
        from memsifter.ranker.messages import TEMPLATES

        if self.template not in TEMPLATES:
            raise ValueError(f"template must be one of {TEMPLATES}, got {self.template!r}")
        if self.template == "official":
            ours = {
                "ranking_head": (self.ranking_head, "generate"),
                "ask_think": (self.ask_think, True),
                "labels": (self.labels, DEFAULT_LABELS),
                "layout": (self.layout, DEFAULT_LAYOUT),
                "language": (self.language, "en"),
                "unit": (self.unit, "session"),
                "coarse_weight": (self.coarse_weight, DEFAULT_COARSE_WEIGHT),
            }
            wrong = {k: v for k, (v, want) in ours.items() if v != want}
            if wrong:
                raise ValueError(
                    "template: official is the released model's own prompt (English sessions, "
                    "thinking, then a written ranking of 0-based ids); it cannot take "
                    + ", ".join(f"{k}: {v!r}" for k, v in wrong.items())
                )
        if "enable_thinking" in self.chat_template_kwargs:
            raise ValueError(
                "chat_template_kwargs.enable_thinking is derived from ask_think; set ask_think"
            )

    @property
    def budget_tokens(self) -> int:
        return self.window_tokens - self.completion_tokens

    def builder(self, tokenizer: Any, coarse: CoarseFilter | None = None) -> PromptBuilder:
        """The one renderer, configured by this spec. ``coarse`` defaults to ``self.coarse``."""
        from memsifter.ranker.prompt import PromptBuilder

        if coarse is None:
            from memsifter.coarse import build_filter

            coarse = build_filter(self.coarse)
        return PromptBuilder(
            tokenizer,
            self.window_tokens,
            self.completion_tokens,
            coarse=coarse,
            language=self.language,  # type: ignore[arg-type]
            ask_think=self.ask_think,
            order=self.order,  # type: ignore[arg-type]
            chat_template_kwargs=self.chat_template_kwargs,
            ranking_head=self.ranking_head,
            labels=self.labels,
            layout=self.layout,  # type: ignore[arg-type]
            head_read=self.head_read,
            rank_all=bool(self.coarse_weight),
            template=self.template,
        )

    def parse(self, text: str, num_candidates: int) -> ParsedRanking:
        """The model's completion read by this spec's rules: ours
        (:func:`~memsifter.ranker.parse.parse_ranking`) or, with ``template: official``, the
        released model's (:func:`~memsifter.ranker.official.parse_official`)."""
        if self.template == "official":
            from memsifter.ranker.official import parse_official

            return parse_official(text, num_candidates)
        from memsifter.ranker.parse import parse_ranking

        return parse_ranking(text, num_candidates)

    def to_dict(self) -> dict[str, Any]:
        """The spec as written to ``prompt_spec.json``; the default labelling and layout are left
        out so a digits, paper spec reads and writes byte-identically to one made before either
        existed (:meth:`fields` has every field, for comparisons)."""
        data = self.fields()
        if data["labels"] == DEFAULT_LABELS:
            del data["labels"]
        if data["layout"] == DEFAULT_LAYOUT:
            del data["layout"]
        if data["head_read"] == DEFAULT_HEAD_READ:
            del data["head_read"]
        if data["coarse_weight"] == DEFAULT_COARSE_WEIGHT:
            del data["coarse_weight"]
        if data["template"] == DEFAULT_TEMPLATE:
            del data["template"]
        return data

    def fields(self) -> dict[str, Any]:
        """Every field, the defaults included: what two specs are compared by."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> PromptSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataError(f"unknown prompt spec keys {unknown}", file=source)
        try:
            return cls(**data)
        except (TypeError, ValueError) as e:
            raise DataError(f"invalid prompt spec: {e}", file=source) from e

    def with_model(self, model: str) -> PromptSpec:
        """The same prompt, rendered with another name for the same tokenizer (a checkpoint
        of the model the spec was made for)."""
        return dataclasses.replace(self, model=model)


__all__ = [
    "CANDIDATE_ORDERS",
    "DEFAULT_LABELS",
    "DEFAULT_HEAD_READ",
    "DEFAULT_LAYOUT",
    "RANKING_HEADS",
    "CandidateOrder",
    "PromptSpec",
]
