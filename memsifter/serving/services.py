"""The service's parts built from a config: the store (migrated, bootstrap keys added), the
ranker, the keyword extractor, the memory layer and the metrics. The HTTP app
(``serving.app``) and ``memsifter mcp`` over stdio (``serving.mcp.stdio``) both serve what
``build_services`` returns, and end it with ``close_services``."""

from __future__ import annotations

import logging
import os

from memsifter.llm.openai_http import OpenAIBackend
from memsifter.serving.bookmarks import KeywordExtractor, LLMExtractor, YakeExtractor
from memsifter.serving.config import ServeConfig
from memsifter.serving.deps import Services
from memsifter.serving.memory import MemoryService
from memsifter.serving.metrics import Metrics
from memsifter.serving.ranking import ServiceRanker
from memsifter.serving.ratelimit import RateLimiter
from memsifter.serving.store import PrincipalCache, Store, hash_key

logger = logging.getLogger("memsifter.serving")


def build_extractor(config: ServeConfig, ranker: ServiceRanker) -> KeywordExtractor:
    b = config.bookmarks
    if b.extractor == "llm" and ranker.backend is not None:
        return LLMExtractor(ranker.backend, max_keywords=b.max_keywords)
    return YakeExtractor(max_keywords=b.max_keywords, max_ngram=b.max_ngram, language=b.language)


def bootstrap_keys(config: ServeConfig, store: Store) -> None:
    """Add the configured keys that are missing, except revoked ones: an admin's revocation
    outlives every restart (the store records it)."""
    for i, k in enumerate(config.api_keys):
        key = os.environ.get(k.key_env) if k.key_env else None
        if k.key_env and not key:
            logger.warning(
                "api_keys[%d]: environment variable %s is not set; key skipped", i, k.key_env
            )
            continue
        if store.key_revoked(k.key_sha256 or hash_key(key or "")):
            logger.warning(
                "api_keys[%d] (tenant %s) was revoked through the admin API; not added again. "
                "Configure a new key to restore access",
                i,
                k.tenant,
            )
            continue
        store.add_api_key(
            k.tenant, key=key, key_sha256=k.key_sha256, agent=k.agent, fact_types=k.fact_types
        )


def build_services(
    config: ServeConfig,
    ranker: ServiceRanker | None = None,
    *,
    extractor: KeywordExtractor | None = None,
) -> Services:
    """The store (migrated, bootstrap keys added), ranker and memory layer of a config: what
    the app serves, and what ``memsifter mcp`` serves over stdio. ``close_services`` ends them."""
    store = Store(config.db_url)
    store.migrate()
    bootstrap_keys(config, store)
    ranker = ranker or ServiceRanker.from_config(config)
    metrics = Metrics(ranker.name)
    ranker.on_proxy = metrics.observe_proxy
    ranker.on_index_load = metrics.observe_index_load
    ranker.on_index_cache = metrics.observe_index_cache
    memory = MemoryService(config, store, ranker, extractor or build_extractor(config, ranker))
    limits = config.limits
    limiter = RateLimiter(limits.rate_per_s, limits.burst) if limits.rate_per_s else None
    return Services(
        config, store, ranker, memory, metrics, limiter, PrincipalCache(config.auth_cache_s)
    )


def close_services(services: Services) -> None:
    services.store.close()
    if isinstance(services.ranker.backend, OpenAIBackend):
        services.ranker.backend.close()  # the proxy's kept-alive connections
