"""The recall service's settings: one typed dataclass tree loaded from YAML (by default the
packaged ``memsifter/resources/serve_default.yaml``, linked as ``configs/serve/default.yaml`` in a
checkout) through ``memsifter.config.from_dict``, so a typo in a key or a wrong type fails at
startup naming the file and the key.

Secrets never live in the YAML: a bootstrap API key is given as the name of an environment
variable holding it (``key_env``) or as its sha256 (``key_sha256``); the store keeps hashes only.
``MEMSIFTER_SERVE_DB_URL`` overrides ``db_url`` so one config file serves every deployment.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsifter.config import from_dict, read_yaml, setting
from memsifter.errors import DataError
from memsifter.resources import SERVE_DEFAULT

if TYPE_CHECKING:
    from memsifter.llm import BackendSpec
    from memsifter.ranker.spec import PromptSpec

logger = logging.getLogger(__name__)

RANKERS = ("coarse", "proxy")
PROXY_BACKENDS = ("transformers", "openai")
PROXY_DTYPES = ("float32", "bfloat16", "float16")
PROXY_SERVERS = ("vllm", "llamacpp")  # memsifter.llm.openai_http.SERVERS, without its import
FACT_TYPES = ("entity", "preference", "event", "task")
KEYWORD_EXTRACTORS = ("yake", "llm")
DEFAULT_CONFIG = SERVE_DEFAULT
# Ceilings the API schema declares (so clients see them in OpenAPI); limits may lower them.
TOP_K_MAX = 100
QUESTION_MAX_CHARS = 2_000


@dataclass(frozen=True)
class ProxySettings:
    """The proxy model and how it is called. What it is *shown* is its prompt spec
    (:class:`~memsifter.ranker.spec.PromptSpec`): the ``prompt_spec.json`` in the model's folder
    (a trained checkpoint or adapter, ``memsifter-smollm2-135m-locomo``), or for a model without
    one (an untrained base) the ``prompt:`` block here; see :meth:`prompt_spec`. Used only when
    the service's ``ranker`` is ``proxy``."""

    backend: str = "transformers"  # transformers | openai
    model: str = "smollm2-135m-instruct"  # hub id, local folder or built-in offline name
    base_url: str | None = None  # openai: the vLLM (or any OpenAI-compatible) server
    served_model_name: str | None = None
    # PromptSpec fields (window_tokens, completion_tokens, language, ask_think, unit,
    # turns_per_page, coarse, order, chat_template_kwargs), or the path of a prompt_spec.json.
    # Needed only for a model without its own spec; with one it may only repeat it.
    prompt: dict[str, Any] | str | None = None
    temperature: float = 0.0
    # transformers: the weights' dtype (float32 | bfloat16 | float16); null keeps float32.
    # bfloat16 pays only on a CPU with AMX or AVX512-BF16 (bf16 autocast: a 2.5x faster forward
    # on such a Xeon, eval/results/bench_cpu_autocast/bench_cpu_autocast.md); elsewhere it is
    # emulated and slower.
    # It moves the scores a little: `python -m eval.bench.bench_head_latency` times both dtypes and
    # measures how the rankings agree with float32 on the machine at hand.
    dtype: str | None = None
    max_candidates: int = 40  # fused coarse+bookmark top-N shown to the proxy
    # A local transformers model is not thread-safe and saturates the CPU alone; an HTTP server
    # batches concurrent requests itself.
    max_concurrency: int = 1
    timeout_s: float = 120.0
    # openai: send the prompt as token ids (vLLM, llama.cpp); false for servers that take text
    token_ids: bool = True
    # openai: which server is behind base_url (vllm | llamacpp), said, never guessed. A model
    # whose spec reads the head at markers (head_read: marker) needs it, and a server started
    # for that read (docs/ranking_head.md, "Head reads"); null serves every other proxy.
    server: str | None = None

    def __post_init__(self) -> None:
        if self.backend == "coarse-only":
            raise ValueError(
                "proxy.backend: coarse-only is gone; a service without a model says so with "
                "`ranker: coarse` at the top level of the config"
            )
        if self.backend not in PROXY_BACKENDS:
            raise ValueError(f"proxy.backend must be one of {PROXY_BACKENDS}, got {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise ValueError("proxy.base_url is required with the openai backend")
        if self.server is not None and self.server not in PROXY_SERVERS:
            raise ValueError(f"proxy.server must be one of {PROXY_SERVERS}, got {self.server!r}")
        if self.max_candidates < 1 or self.max_concurrency < 1:
            raise ValueError("proxy.max_candidates and proxy.max_concurrency must be >= 1")
        if self.dtype is not None:
            if self.backend != "transformers":
                raise ValueError(
                    f"proxy.dtype is the in-process model's (backend: transformers); with "
                    f"backend: {self.backend} the server chooses its own dtype"
                )
            if self.dtype not in PROXY_DTYPES:
                raise ValueError(f"proxy.dtype must be one of {PROXY_DTYPES}, got {self.dtype!r}")

    def backend_spec(self) -> BackendSpec:
        """The proxy's LLM as the one backend description every config embeds."""
        from memsifter.llm import BackendSpec

        return BackendSpec(
            kind=self.backend,
            model=self.model,
            base_url=self.base_url,
            served_model_name=self.served_model_name,
            max_concurrency=self.max_concurrency,
            timeout_s=self.timeout_s,
            server=self.server if self.backend == "openai" else None,
            dtype=self.dtype,
            options={"token_ids": self.token_ids} if self.backend == "openai" else {},
        )

    def prompt_spec(self) -> PromptSpec:
        """The model's own spec, or the explicit ``prompt:`` one (refused when it has neither,
        or when ``prompt:`` contradicts the model's own)."""
        from memsifter.ranker.checkpoint import resolve_spec

        return resolve_spec(self.model, self.prompt, hint="a `proxy.prompt:` block in the config")


@dataclass(frozen=True)
class LimitSettings:
    """Hard input limits; anything over them is a 413/422 naming the field."""

    max_body_bytes: int = 2_000_000
    # Longest wait for the next chunk of a request body (408 after it); None: wait forever.
    body_timeout_s: float | None = 30.0
    # A total deadline, however the bytes trickle in: the headers must be complete within this
    # many seconds of the request's first byte (else 408 and the connection is closed), and
    # the body within this many seconds of the headers (408). None: no deadline.
    request_deadline_s: float | None = 30.0
    # Open connections one process holds; past it a new request is answered 503 at once
    # (uvicorn's limit_concurrency), not queued behind slow clients. None: no bound.
    max_connections: int | None = 1000
    max_sessions: int = 200  # per request (rank candidates, one ingest)
    max_turns_per_session: int = 1000
    max_turns_per_request: int = 5000  # raw-turn ingest
    max_text_chars: int = 20_000  # one turn's text
    max_question_chars: int = 2_000
    max_top_k: int = 100
    max_budget_tokens: int = 200_000
    max_facts_listed: int = 500
    rate_per_s: float | None = None  # per tenant and replica; None: no rate limit
    burst: int = 20  # requests a tenant may send at once before the rate applies

    def __post_init__(self) -> None:
        if self.rate_per_s is not None and (self.rate_per_s <= 0 or self.burst < 1):
            raise ValueError("limits.rate_per_s must be > 0 (or null) and limits.burst >= 1")
        # The API schema declares these ceilings; a higher limit would be refused by it anyway.
        if self.body_timeout_s is not None and self.body_timeout_s <= 0:
            raise ValueError("limits.body_timeout_s must be > 0 (or null)")
        if self.request_deadline_s is not None and self.request_deadline_s <= 0:
            raise ValueError("limits.request_deadline_s must be > 0 (or null)")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("limits.max_connections must be >= 1 (or null)")
        if not 1 <= self.max_top_k <= TOP_K_MAX:
            raise ValueError(f"limits.max_top_k must be within 1..{TOP_K_MAX}")
        if not 1 <= self.max_question_chars <= QUESTION_MAX_CHARS:
            raise ValueError(f"limits.max_question_chars must be within 1..{QUESTION_MAX_CHARS}")


@dataclass(frozen=True)
class PagingSettings:
    """Cooperative paging of memory pages into the working LLM's context.

    Watermarks are fractions of the tokens left for pages after facts and recent turns: nothing
    is evicted while the resident pages stay under ``high_watermark``; once over it, the least
    relevant resident pages go until usage is at or under ``low_watermark``. The gap stops a
    page set that hovers at the limit from thrashing on every turn.
    """

    turns_per_page: int = 4
    high_watermark: float = 0.9
    low_watermark: float = 0.6
    page_in_k: int = 5  # pages recall offers per context request
    facts_fraction: float = 0.2  # most of the budget pinned facts may take
    recent_fraction: float = 0.3  # most of the budget recent turns may take
    recent_turns: int = 8
    tokenizer: str | None = None  # budgets in this tokenizer's tokens; None: regex approximation

    def __post_init__(self) -> None:
        if not 0.0 < self.low_watermark <= self.high_watermark <= 1.0:
            raise ValueError("paging watermarks need 0 < low_watermark <= high_watermark <= 1")
        if self.turns_per_page < 1:
            raise ValueError("paging.turns_per_page must be >= 1")
        for name in ("facts_fraction", "recent_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"paging.{name} must be within 0..1")


@dataclass(frozen=True)
class BookmarkSettings:
    extractor: str = "yake"  # yake (offline) | llm (the proxy backend; needs ranker: proxy)
    max_keywords: int = 8
    max_ngram: int = 2
    language: str = "en"
    rrf_k: int = 60  # reciprocal-rank fusion constant for coarse + bookmark rankings

    def __post_init__(self) -> None:
        if self.extractor not in KEYWORD_EXTRACTORS:
            raise ValueError(f"bookmarks.extractor must be one of {KEYWORD_EXTRACTORS}")


@dataclass(frozen=True)
class FactSettings:
    decay_per_day: float = 0.01  # score multiplier 1 / (1 + decay_per_day * days)
    sweep_interval_s: float = 3600.0  # background purge of expired facts; 0 disables it
    context_max_facts: int = 20


@dataclass(frozen=True)
class ApiKeySettings:
    """A key created at startup if missing. Exactly one of ``key_env``/``key_sha256``."""

    tenant: str
    key_env: str | None = None  # environment variable holding the plaintext key
    key_sha256: str | None = None  # or its hex sha256, so not even the env holds it
    agent: str | None = None  # the agent this key speaks for (logs, fact visibility)
    fact_types: list[str] | None = None  # fact types this agent may see; None: all

    def __post_init__(self) -> None:
        if (self.key_env is None) == (self.key_sha256 is None):
            raise ValueError("api_keys: give exactly one of key_env or key_sha256")
        for t in self.fact_types or ():
            if t not in FACT_TYPES:
                raise ValueError(f"api_keys.fact_types: unknown type {t!r}; use {FACT_TYPES}")


@dataclass(frozen=True)
class AdminSettings:
    """The key admin API (``/v1/admin``: create, list and revoke tenant keys). It is on only
    when its key is given, by environment variable or by sha256, like the bootstrap keys."""

    key_env: str | None = "MEMSIFTER_ADMIN_KEY"
    key_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.key_env is not None and self.key_sha256 is not None:
            raise ValueError("admin: give key_env or key_sha256, not both")


@dataclass(frozen=True)
class ServeConfig:
    db_url: str = setting(
        "sqlite:///memsifter.db", help="store URL ($MEMSIFTER_SERVE_DB_URL overrides it)"
    )
    coarse: str = setting("bm25", help="coarse filter spec: bm25, minilm, hybrid:bm25+minilm")
    # coarse: the fused coarse order (coarse filter + bookmarks) is the answer, no model runs;
    # proxy: the proxy model re-ranks the fused top candidates (the `proxy:` block).
    ranker: str = setting("coarse", help="coarse | proxy (re-ranks with the proxy: block)")
    proxy: ProxySettings = field(default_factory=ProxySettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    paging: PagingSettings = field(default_factory=PagingSettings)
    bookmarks: BookmarkSettings = field(default_factory=BookmarkSettings)
    facts: FactSettings = field(default_factory=FactSettings)
    api_keys: list[ApiKeySettings] = field(default_factory=list)
    admin: AdminSettings = field(default_factory=AdminSettings)
    # A key that authenticated is trusted for this long without a database lookup. A revoked
    # key is refused at once by the worker that revoked it, within this by the others. 0: off.
    auth_cache_s: float = setting(1.0, help="seconds a checked API key skips the store; 0: off")
    # An idle kept-alive connection is closed after this. Longer than clients keep theirs
    # (httpx: 5 s, uvicorn's own default too), so a client never sends on a connection the
    # server is closing at that moment (a reset: httpx ReadError), and a load balancer in
    # front (commonly 60 s idle) closes first.
    keep_alive_s: float = setting(75.0, help="seconds an idle kept-alive connection stays open")
    index_cache_users: int = setting(256, help="per-user coarse indexes kept in memory (LRU)")
    # Users differ by orders of magnitude, so a count alone does not bound memory. Estimated
    # bytes (StoredIndex.nbytes: 32 B a page, ~24 B a cached posting; UserIndex.nbytes, the
    # pages, for a non-BM25 filter). A 100K-session user with every term cached is ~0.1 GB.
    index_cache_bytes: int = setting(
        512_000_000,
        help="estimated bytes of per-user indexes kept in memory (LRU); a user over it alone "
        "is served without being kept",
    )
    token_cache_pages: int = setting(
        500_000, help="pages' proxy-token counts kept in memory (LRU, ~150 B each)"
    )
    rank_cache_bytes: int = setting(
        64_000_000,
        help="bytes of /v1/rank and /v1/rerank BM25 indexes kept in memory, every tenant's "
        "together (LRU; each tenant finds only its own)",
    )
    # Off by default: FastAPI's /docs and /redoc pages run Swagger UI and ReDoc from a public
    # CDN on this origin, the recall inspector's, whose tab keeps a tenant key. The schema
    # itself (/openapi.json) is always served. Not "api_docs: off": YAML reads off as false.
    api_docs_from_cdn: bool = setting(
        False,
        help="serve /docs (Swagger UI) and /redoc, whose pages load their scripts and styles "
        "from cdn.jsdelivr.net",
    )
    sample_tenant: str = setting("demo", help="the tenant --seed-sample writes to")
    sample_key_env: str = setting(
        "MEMSIFTER_DEMO_KEY", help="environment variable of --seed-sample's API key"
    )

    def __post_init__(self) -> None:
        if self.keep_alive_s <= 0:
            raise ValueError(f"keep_alive_s must be > 0, got {self.keep_alive_s}")
        if self.index_cache_bytes <= 0:
            raise ValueError(f"index_cache_bytes must be > 0, got {self.index_cache_bytes}")
        if self.auth_cache_s < 0:
            raise ValueError(f"auth_cache_s must be >= 0, got {self.auth_cache_s}")
        if self.ranker not in RANKERS:
            raise ValueError(f"ranker must be one of {RANKERS}, got {self.ranker!r}")
        if self.bookmarks.extractor == "llm" and self.ranker != "proxy":
            raise ValueError("bookmarks.extractor: llm needs the proxy model (ranker: proxy)")
        if self.ranker == "proxy":
            self.check_prompt(self.proxy.prompt_spec())
        elif self.proxy != ProxySettings():
            logger.warning(
                "the proxy block is ignored: ranker is coarse (set ranker: proxy to serve %r)",
                self.proxy.model,
            )

    def check_prompt(self, spec: PromptSpec) -> None:
        """The service cuts what it stores into pages of ``paging.turns_per_page`` turns and
        shows the proxy those: a proxy trained on pages must get pages of its own size."""
        if spec.unit == "page" and spec.turns_per_page != self.paging.turns_per_page:
            raise ValueError(
                f"paging.turns_per_page is {self.paging.turns_per_page}, but the proxy "
                f"{self.proxy.model!r} is shown pages of {spec.turns_per_page} turns (its prompt "
                f"spec); set paging.turns_per_page: {spec.turns_per_page}"
            )
        whole = self.paging.turns_per_page >= self.limits.max_turns_per_session
        if spec.unit != "page" and not whole:
            logger.warning(
                "the proxy %r's prompt spec has unit %s (whole sessions as candidates); the "
                "service shows it pages of %d turns (set paging.turns_per_page to "
                "limits.max_turns_per_session for whole sessions)",
                self.proxy.model,
                spec.unit,
                self.paging.turns_per_page,
            )

    @property
    def ranker_name(self) -> str:
        """What every response reports as ``ranker``."""
        if self.ranker == "coarse":
            return "coarse-only"
        return f"proxy:{self.proxy.backend}:{self.proxy.model}"


def load_serve_config(path: str | Path | None = None) -> ServeConfig:
    """``path`` (default the packaged ``serve_default.yaml``), then environment overrides."""
    source = Path(path or DEFAULT_CONFIG)
    raw = read_yaml(source)
    cfg = from_dict(ServeConfig, raw, file=str(source))
    if isinstance(raw, dict) and "proxy" in raw and "ranker" not in raw:
        # A proxy block alone would be served coarse-only (ranker defaults to coarse): a config
        # written to serve a model must say so, or say it keeps the block unused.
        raise DataError(
            "the config has a proxy block but no ranker: set `ranker: proxy` to serve that "
            "model, or `ranker: coarse` to keep the block unused",
            file=str(source),
            field="ranker",
        )
    db_url = os.environ.get("MEMSIFTER_SERVE_DB_URL")
    return replace(cfg, db_url=db_url) if db_url else cfg
