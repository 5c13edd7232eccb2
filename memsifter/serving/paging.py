"""Cooperative paging: which memory pages stay in the working LLM's context for this turn.

The *resident set* is the pages paged in on earlier turns (persisted per user). Each context
request offers new pages from recall (page-in always comes from recall). Then:

* while resident + offered pages stay within ``high_watermark`` of the page budget, every
  offered page is paged in and nothing is evicted, so a stable conversation keeps its pages and
  the working LLM's prompt prefix (and its KV cache) stays put;
* above it, resident and offered pages are ranked together by relevance to the current question
  in **one** batched ranker call (the proxy when the service has one), and pages are dropped
  from the least relevant up until usage is at or under ``low_watermark`` (the most relevant
  page is kept whenever it fits the budget): resident ones are paged out, offered ones skipped.
  Stopping at the low mark leaves headroom, so the next few turns page in without evicting
  again (no thrashing at the limit).

A page larger than the whole page budget is skipped outright. Every decision becomes a
``PagingEvent`` with its reason; the caller persists and logs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memsifter.serving.store.records import PagingEvent


@dataclass(frozen=True)
class PageSlot:
    page_id: str
    tokens: int


@dataclass(frozen=True)
class PagingPlan:
    page_in: tuple[str, ...]
    page_out: tuple[str, ...]
    skipped: tuple[str, ...]
    resident: tuple[str, ...]  # after the plan, in the order to show them
    used_tokens: int
    budget_tokens: int
    high_tokens: int
    low_tokens: int
    evicted: bool  # the high watermark was crossed and the relevance call made
    events: tuple[PagingEvent, ...] = field(default_factory=tuple)


def plan_paging(
    resident: Sequence[PageSlot],
    offered: Sequence[PageSlot],
    budget_tokens: int,
    *,
    high_watermark: float,
    low_watermark: float,
    relevance: Callable[[list[str]], Sequence[str]],
    request_id: str | None = None,
) -> PagingPlan:
    """``offered`` best first (recall order); ``relevance(ids)`` returns those ids best first."""
    high = int(budget_tokens * high_watermark)
    low = int(budget_tokens * low_watermark)
    events: list[PagingEvent] = []
    resident_ids = {p.page_id for p in resident}
    incoming: list[PageSlot] = []
    skipped: list[str] = []
    seen = set(resident_ids)
    for p in offered:
        if p.page_id in seen:
            continue
        seen.add(p.page_id)
        if p.tokens > budget_tokens:
            skipped.append(p.page_id)
            events.append(
                _event(
                    "skip",
                    p,
                    f"page ({p.tokens} tokens) exceeds the page budget ({budget_tokens})",
                    None,
                    request_id,
                )
            )
            continue
        incoming.append(p)

    pool = list(resident) + incoming
    tokens = {p.page_id: p.tokens for p in pool}
    used = sum(tokens.values())
    if used <= high:
        for p in incoming:
            events.append(
                _event(
                    "in",
                    p,
                    f"recalled; {used}/{high} tokens under high watermark",
                    None,
                    request_id,
                )
            )
        return PagingPlan(
            page_in=tuple(p.page_id for p in incoming),
            page_out=(),
            skipped=tuple(skipped),
            resident=tuple(p.page_id for p in pool),
            used_tokens=used,
            budget_tokens=budget_tokens,
            high_tokens=high,
            low_tokens=low,
            evicted=False,
            events=tuple(events),
        )

    order = list(dict.fromkeys(sid for sid in relevance(list(tokens)) if sid in tokens))
    ranked = set(order)
    order += [sid for sid in tokens if sid not in ranked]  # a ranker that omitted some
    rank = {sid: i for i, sid in enumerate(order)}
    n = len(order)
    dropped: set[str] = set()
    over = used
    for sid in reversed(order):
        # The most relevant page stays even when it alone is over the low watermark: an empty
        # context would serve this question worse than a fuller one serves the next.
        if over <= low or (sid == order[0] and tokens[sid] <= budget_tokens):
            break
        dropped.add(sid)
        over -= tokens[sid]
    page_out = [p.page_id for p in resident if p.page_id in dropped]
    page_in = [p.page_id for p in incoming if p.page_id not in dropped]
    by_id = {p.page_id: p for p in pool}
    reason_over = f"{used} tokens over high watermark {high}; evicting to low watermark {low}"
    for sid in page_out:
        events.append(
            _event(
                "out",
                by_id[sid],
                f"{reason_over}; relevance {rank[sid] + 1}/{n}",
                rank[sid],
                request_id,
            )
        )
    for p in incoming:
        if p.page_id in dropped:
            skipped.append(p.page_id)
            events.append(
                _event(
                    "skip",
                    p,
                    f"{reason_over}; relevance {rank[p.page_id] + 1}/{n}",
                    rank[p.page_id],
                    request_id,
                )
            )
        else:
            events.append(
                _event(
                    "in",
                    p,
                    f"recalled; relevance {rank[p.page_id] + 1}/{n}",
                    rank[p.page_id],
                    request_id,
                )
            )
    kept = [p.page_id for p in pool if p.page_id not in dropped]
    return PagingPlan(
        page_in=tuple(page_in),
        page_out=tuple(page_out),
        skipped=tuple(skipped),
        resident=tuple(kept),
        used_tokens=over,
        budget_tokens=budget_tokens,
        high_tokens=high,
        low_tokens=low,
        evicted=True,
        events=tuple(events),
    )


def _event(
    action: str, page: PageSlot, reason: str, rank: int | None, request_id: str | None
) -> PagingEvent:
    return PagingEvent(
        action=action,
        page_id=page.page_id,
        tokens=page.tokens,
        reason=reason,
        relevance_rank=rank,
        request_id=request_id,
    )
