"""Every request and response body of the recall service, in one module (the OpenAPI schema at
``/openapi.json`` is generated from these).

Requests forbid unknown keys, so a misspelt field is a 422 naming it rather than silently
ignored. Text fields reject lone UTF-16 surrogates and NUL characters: JSON can spell both
(``"\\ud800"``, ``"\\u0000"``), but neither can be stored as UTF-8 text (PostgreSQL refuses NUL
outright), and failing later would be a 500. Limits that depend on the deployment (how many
sessions, how long a text) are checked by the routes against ``ServeConfig.limits``; the ones a
client must know to call the API at all (``top_k``, a question's length) are also declared here,
as ceilings that a deployment may lower but not raise, so they appear in the OpenAPI schema.
Integers are strict: ``true`` is not a ``top_k``.

Session ids may contain ``/`` (``conv/7``), but no segment may be empty, ``.`` or ``..``: HTTP
clients collapse such paths (``x/../keep`` becomes ``keep``), so a request for one id would
reach another. Every datetime in a response is UTC with its offset (RFC 3339), since the store
keeps naive UTC.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from memsifter.serving.config import FACT_TYPES, QUESTION_MAX_CHARS, TOP_K_MAX

USER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$"
# No '#': page ids are "<session id>#<first turn id>". Segments after a '/' are any run of the
# id characters except "." and ".." (see the module doc); the first starts alphanumeric.
_SEGMENT = (
    r"(?:[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*|\.[A-Za-z0-9_:@-][A-Za-z0-9._:@-]*|\.\.[A-Za-z0-9._:@-]+)"
)
SESSION_ID_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._:@-]*(?:/{_SEGMENT})*$"
SESSION_ID_MAX_CHARS = 128
SUBJECT_MAX_CHARS = 200  # the stored, normalised subject (facts.subject)
TURN_ID_PATTERN = r"^[A-Za-z0-9._:/@-]{1,64}$"
FACT_ID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_BAD_CHARS = re.compile("[\x00\ud800-\udfff]")

FactType = Literal["entity", "preference", "event", "task"]
assert set(FactType.__args__) == set(FACT_TYPES)  # type: ignore[attr-defined]


def _clean(value: str) -> str:
    bad = _BAD_CHARS.search(value)
    if bad is not None:
        what = "a NUL character" if bad.group() == "\x00" else "a lone UTF-16 surrogate"
        raise ValueError(f"text contains {what} at index {bad.start()}")
    return value


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


def _aware_utc(value: datetime) -> datetime:
    """Stored datetimes are naive UTC; a response says so with its offset."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def _naive_utc(value: datetime) -> datetime:
    """Aware datetimes become naive UTC (the store's convention) here, where a value that
    cannot be expressed in UTC (year 1 at +14:00) is still a 422 naming its field."""
    if value.tzinfo is None:
        return value
    try:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    except (OverflowError, ValueError) as e:
        raise ValueError(f"datetime out of range in UTC: {e}") from e


Text = Annotated[str, AfterValidator(_clean)]
UtcDateTime = Annotated[datetime, AfterValidator(_naive_utc)]
UtcOut = Annotated[datetime, AfterValidator(_aware_utc)]
NonBlank = Annotated[str, AfterValidator(_clean), AfterValidator(_not_blank)]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------------------------- shared parts


class TurnIn(Request):
    speaker: NonBlank = Field(max_length=128, examples=["user"])
    text: Text = Field(examples=["I adopted a dog named Max last spring."])
    turn_id: str | None = Field(default=None, pattern=TURN_ID_PATTERN)
    timestamp: UtcDateTime | None = None


class SessionIn(Request):
    id: str = Field(
        pattern=SESSION_ID_PATTERN,
        max_length=SESSION_ID_MAX_CHARS,
        examples=["2024-05-01-evening", "conv/7"],
    )
    date: UtcDateTime | None = None
    date_text: Text | None = Field(default=None, max_length=64, examples=["1 May 2024"])
    turns: list[TurnIn] = Field(min_length=1)


class TurnOut(Response):
    speaker: str
    text: str
    turn_id: str | None = None
    timestamp: UtcOut | None = None


class ParseOut(Response):
    """How the proxy's answer was read (``not_applicable`` for coarse-only)."""

    status: Literal["ok", "failed", "not_applicable"]
    error: str | None = None
    completed: bool = False
    n_from_model: int = 0
    dropped: int = 0
    duplicates: int = 0
    # Candidates the proxy's prompt showed, and those the coarse filter cut from it (its window,
    # or the first-token head's label count), which follow in coarse order.
    shown: int = 0
    cut_by_coarse: int = 0


class Timings(Response):
    # Finding the user's index (recall and context only; None for stateless rankings): 0 when
    # warm, else reading the index (or the pages) from the store, or waiting for another
    # request that was. index_load says which (ranking.IndexLoad): warm, waited, caught_up,
    # opened, reindexed or rebuilt.
    index_ms: float | None = None
    index_load: Literal["warm", "waited", "caught_up", "opened", "reindexed", "rebuilt"] | None = (
        None
    )
    # False: the user's index is over index_cache_bytes by itself and was not kept.
    index_cached: bool | None = None
    coarse_ms: float = 0.0
    proxy_ms: float | None = None  # the proxy stage: slot wait, prompt, model call, parse
    model_ms: float | None = None  # the model call alone, as the backend timed it
    total_ms: float = 0.0  # index_ms included


class ErrorField(Response):
    field: str
    message: str


class ErrorBody(Response):
    type: str
    message: str
    fields: list[ErrorField] = []  # the first 20 field errors
    fields_total: int = 0  # how many there were (more than listed when over 20)


class ErrorResponse(Response):
    error: ErrorBody
    request_id: str | None = None


# -------------------------------------------------------------------------------------- /v1/rank


class RankIn(Request):
    question: NonBlank = Field(max_length=QUESTION_MAX_CHARS, examples=["What is my dog called?"])
    question_date: Text | None = Field(default=None, max_length=64)
    sessions: list[SessionIn] = Field(min_length=1)
    top_k: int | None = Field(default=None, ge=1, le=TOP_K_MAX, strict=True)


class RankedItem(Response):
    id: str
    rank: int
    score: float | None = None  # coarse score; the proxy orders but does not score


class RankOut(Response):
    ranker: str
    ranking: list[RankedItem]
    think: str | None = None
    parse: ParseOut
    timings: Timings
    request_id: str | None = None


# ---------------------------------------------------------------- /v1/rerank (Cohere/Jina/vLLM)


class RerankDocument(Request):
    text: Text


class RerankIn(Request):
    """The rerank request Cohere's, Jina's and vLLM's clients send. Unknown keys are still a 422
    naming them; ``priority`` and ``max_tokens_per_doc`` are taken because the Cohere SDK sends
    them when its caller sets them."""

    model: Text | None = Field(
        default=None,
        max_length=256,
        description="echoed in the response's `model`; the service ranks with its own ranker",
    )
    query: NonBlank = Field(max_length=QUESTION_MAX_CHARS, examples=["What is my dog called?"])
    documents: list[Text | RerankDocument] = Field(
        min_length=1, examples=[["I adopted a dog named Max.", {"text": "We went hiking."}]]
    )
    top_n: int | None = Field(default=None, ge=1, strict=True)
    return_documents: bool = Field(default=True, strict=True)
    max_tokens_per_doc: int | None = Field(
        default=None,
        ge=1,
        strict=True,
        description="each document is cut to this many whitespace-separated words before ranking",
    )
    priority: int | None = Field(
        default=None, strict=True, description="accepted for the Cohere SDK; one queue here"
    )


class RerankDocumentOut(Response):
    text: str


class RerankResultOut(Response):
    index: int
    relevance_score: float
    document: RerankDocumentOut | None = None


class RerankUsage(Response):
    total_tokens: int


class RerankOut(Response):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResultOut]
    ranker: str
    timings: Timings


# ----------------------------------------------------------------------------------- the memory


class IngestSessionsIn(Request):
    sessions: list[SessionIn] = Field(min_length=1)
    replace: bool = False


class IngestTurnsIn(Request):
    """A raw turn stream, segmented into sessions on time gaps and topic shifts."""

    turns: list[TurnIn] = Field(min_length=1)
    session_prefix: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")
    max_gap_hours: float = Field(default=4.0, gt=0, le=24 * 365)
    topic_threshold: float | None = Field(default=0.05, ge=0, le=1)


class IngestedSession(Response):
    session_id: str
    n_turns: int
    n_pages: int
    n_tokens: int
    page_ids: list[str]


class IngestOut(Response):
    user_id: str
    sessions: list[IngestedSession]


class SessionSummary(Response):
    session_id: str
    date: UtcOut | None
    date_text: str | None
    n_turns: int
    n_tokens: int
    n_pages: int
    created_at: UtcOut


class SessionListOut(Response):
    user_id: str
    total: int
    sessions: list[SessionSummary]


class PageOut(Response):
    page_id: str
    session_id: str
    n_tokens: int
    keywords: list[str]
    turns: list[TurnOut]


class SessionOut(Response):
    session: SessionSummary
    turns: list[TurnOut]
    pages: list[PageOut]


class DeletedOut(Response):
    deleted: int


class RecallIn(Request):
    question: NonBlank = Field(max_length=QUESTION_MAX_CHARS, examples=["What is my dog called?"])
    question_date: Text | None = Field(default=None, max_length=64)
    top_k: int = Field(default=5, ge=1, le=TOP_K_MAX, strict=True)


class RecallHit(Response):
    page_id: str
    session_id: str
    rank: int
    score: float  # fused coarse + bookmark score
    coarse_score: float
    bookmark_score: float | None
    keywords: list[str]
    date: UtcOut | None
    date_text: str | None
    n_tokens: int
    text: str


class RecallOut(Response):
    ranker: str
    hits: list[RecallHit]
    think: str | None = None
    parse: ParseOut
    timings: Timings
    request_id: str | None = None


class ContextIn(Request):
    question: NonBlank = Field(max_length=QUESTION_MAX_CHARS, examples=["What is my dog called?"])
    question_date: Text | None = Field(default=None, max_length=64)
    budget_tokens: int = Field(ge=16, strict=True, examples=[2000])
    page_in_k: int | None = Field(default=None, ge=0, le=TOP_K_MAX, strict=True)
    recent_turns: int | None = Field(default=None, ge=0, le=1000, strict=True)


class ContextFact(Response):
    fact_id: str
    type: str
    text: str
    score: float


class TokenUse(Response):
    budget: int
    facts: int
    pages: int
    recent: int
    total: int


class Watermarks(Response):
    page_budget: int
    high: int
    low: int
    used: int
    evicted: bool


class ContextOut(Response):
    ranker: str
    text: str
    tokens: TokenUse
    facts: list[ContextFact]
    pages: list[str]  # resident after this request, in context order
    paged_in: list[str]
    paged_out: list[str]
    skipped: list[str]
    watermarks: Watermarks
    recent_turns: list[TurnOut]
    parse: ParseOut | None = None  # of the eviction ranking, when one was needed
    timings: Timings
    request_id: str | None = None


class PagingEventOut(Response):
    at: UtcOut
    action: str
    page_id: str
    tokens: int
    reason: str
    relevance_rank: int | None
    request_id: str | None


class PagingLogOut(Response):
    user_id: str
    events: list[PagingEventOut]


# ------------------------------------------------------------------------------------------ facts


class FactIn(Request):
    type: FactType
    subject: NonBlank = Field(max_length=200, examples=["home city"])
    text: NonBlank = Field(max_length=2000, examples=["The user lives in Lisbon."])
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    expires_at: UtcDateTime | None = None


class FactPatch(Request):
    """A correction: stored as a new version that supersedes the old one."""

    type: FactType | None = None
    subject: NonBlank | None = Field(default=None, max_length=200)
    text: NonBlank | None = Field(default=None, max_length=2000)
    importance: float | None = Field(default=None, ge=0.0, le=1.0)
    expires_at: UtcDateTime | None = None


class FactOut(Response):
    fact_id: str
    type: str
    subject: str
    text: str
    importance: float
    created_at: UtcOut
    last_accessed_at: UtcOut
    expires_at: UtcOut | None
    source: str | None
    score: float | None = None  # importance x decay, in listings


class FactAddedOut(Response):
    fact: FactOut
    superseded: list[str]


class FactListOut(Response):
    user_id: str
    facts: list[FactOut]


class SweepOut(Response):
    deleted: int


class HealthOut(Response):
    status: str
    ranker: str


# ------------------------------------------------------------------------------------ key admin


class KeyIn(Request):
    agent: Text | None = Field(default=None, max_length=128, examples=["todo-bot"])
    fact_types: list[FactType] | None = Field(
        default=None, description="fact types this key's agent may see; null: all"
    )


class KeyOut(Response):
    key_id: int
    tenant_id: str
    key_sha256_prefix: str
    agent: str | None
    fact_types: list[str] | None
    created_at: UtcOut


class KeyCreatedOut(Response):
    key: str = Field(description="the new key; stored only as a hash, so shown only now")
    info: KeyOut


class KeyListOut(Response):
    tenant_id: str
    keys: list[KeyOut]
