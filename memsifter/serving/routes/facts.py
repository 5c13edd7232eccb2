"""Long-term facts: remember, list ("what do you remember"), correct, forget, sweep.

A key's agent sees (and writes) only the fact types its key allows; another type is a 403 on
write and simply absent on read, so an agent cannot even learn that such facts exist: a new fact
supersedes only live facts of its own type, a deletion removes only visible history, and the
store checks both inside the write's transaction."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path

from memsifter.serving.deps import Svc, UserId, Who, in_thread
from memsifter.serving.errors import NotFoundError, ServeError
from memsifter.serving.facts import normalize_subject, rank_facts
from memsifter.serving.routes.rank import ERRORS
from memsifter.serving.schemas import (
    FACT_ID_PATTERN,
    SUBJECT_MAX_CHARS,
    DeletedOut,
    FactAddedOut,
    FactIn,
    FactListOut,
    FactOut,
    FactPatch,
    SweepOut,
)
from memsifter.serving.store import Store
from memsifter.serving.store.records import Fact, Principal, utcnow

router = APIRouter(prefix="/v1", tags=["facts"])
FACT_ERRORS: dict[int | str, dict[str, Any]] = {**ERRORS, 403: ERRORS[400], 404: ERRORS[400]}
FactId = Annotated[str, Path(pattern=FACT_ID_PATTERN)]


def fact_out(f: Fact, score: float | None = None) -> FactOut:
    return FactOut(
        fact_id=f.fact_id,
        type=f.type,
        subject=f.subject,
        text=f.text,
        importance=f.importance,
        created_at=f.created_at,
        last_accessed_at=f.last_accessed_at,
        expires_at=f.expires_at,
        source=f.source,
        score=score,
    )


def check_fact_type(who: Principal, fact_type: str, field: str) -> None:
    if not who.may_see(fact_type):
        raise ServeError(
            f"this key's agent may not use {fact_type!r} facts", field=field, status=403
        )


def fact_subject(raw: str, field: str) -> str:
    """The supersede key, checked after normalising: lower-casing can lengthen text ("İ" is
    two code points in lower case), and the column holds ``SUBJECT_MAX_CHARS``."""
    subject = normalize_subject(raw)
    if len(subject) > SUBJECT_MAX_CHARS:
        raise ServeError(
            f"subject has {len(subject)} characters once normalised (lower case, single spaces); "
            f"the limit is {SUBJECT_MAX_CHARS}",
            field=field,
            status=422,
        )
    return subject


def visible_fact(store: Store, who: Principal, user: str, fact_id: str, field: str) -> Fact:
    """The fact, if this key may see it; else a 404 naming ``field`` (an unseen type reads as
    unknown, so a key cannot learn that a fact of another agent's type exists)."""
    fact = store.get_fact(who.tenant_id, user, fact_id)
    if fact is None or not who.may_see(fact.type):
        raise NotFoundError(f"unknown fact {fact_id!r}", field=field)
    return fact


def store_fact(store: Store, who: Principal, user: str, body: FactIn, where: str) -> FactAddedOut:
    """Remember ``body`` for ``user`` as the key ``who`` may: its type allowed, its expiry in the
    future, its subject within the column once normalised. ``where`` prefixes the field names of
    errors (``body.`` for the route, nothing for an MCP tool's arguments)."""
    check_fact_type(who, body.type, f"{where}type")
    if body.expires_at is not None and body.expires_at <= utcnow():
        raise ServeError("expires_at is in the past", field=f"{where}expires_at", status=422)
    fact, old = store.add_fact(
        who.tenant_id,
        user,
        type=body.type,
        subject=fact_subject(body.subject, f"{where}subject"),
        text=body.text,
        importance=body.importance,
        expires_at=body.expires_at,
        source=who.agent,
        visible_types=who.fact_types,
    )
    return FactAddedOut(fact=fact_out(fact), superseded=old)


@router.post(
    "/users/{user_id}/facts", response_model=FactAddedOut, status_code=201, responses=FACT_ERRORS
)
@in_thread
def remember(user_id: UserId, body: FactIn, svc: Svc, who: Who) -> FactAddedOut:
    """Remember a fact. A live fact with the same subject is superseded (kept as history,
    never returned again); the response lists those."""
    return store_fact(svc.store, who, user_id, body, "body.")


@router.get("/users/{user_id}/facts", response_model=FactListOut, responses=FACT_ERRORS)
@in_thread
def what_do_you_remember(user_id: UserId, svc: Svc, who: Who) -> FactListOut:
    """Every live fact this key may see, by importance times time decay."""
    now = utcnow()
    facts = svc.store.list_facts(
        who.tenant_id,
        user_id,
        types=who.fact_types,
        now=now,
        limit=svc.config.limits.max_facts_listed,
    )
    ranked = rank_facts(facts, now, None, svc.config.facts.decay_per_day)
    return FactListOut(user_id=user_id, facts=[fact_out(r.fact, r.score) for r in ranked])


@router.get("/users/{user_id}/facts/{fact_id}", response_model=FactOut, responses=FACT_ERRORS)
@in_thread
def get_fact(user_id: UserId, fact_id: FactId, svc: Svc, who: Who) -> FactOut:
    return fact_out(visible_fact(svc.store, who, user_id, fact_id, "path.fact_id"))


@router.patch(
    "/users/{user_id}/facts/{fact_id}", response_model=FactAddedOut, responses=FACT_ERRORS
)
@in_thread
def correct(user_id: UserId, fact_id: FactId, body: FactPatch, svc: Svc, who: Who) -> FactAddedOut:
    """Correct a fact: the result is a new version that supersedes it (history is kept)."""
    if not body.model_fields_set:
        raise ServeError("nothing to correct: send at least one field", field="body", status=422)
    old = visible_fact(svc.store, who, user_id, fact_id, "path.fact_id")
    fact_type = body.type or old.type
    check_fact_type(who, fact_type, "body.type")
    expires = body.expires_at if "expires_at" in body.model_fields_set else old.expires_at
    if expires is not None and expires <= utcnow():
        raise ServeError("expires_at is in the past", field="body.expires_at", status=422)
    fact, superseded = svc.store.add_fact(
        who.tenant_id,
        user_id,
        type=fact_type,
        subject=fact_subject(body.subject, "body.subject") if body.subject else old.subject,
        text=body.text or old.text,
        importance=old.importance if body.importance is None else body.importance,
        expires_at=expires,
        source=who.agent,
        supersedes=fact_id,
        visible_types=who.fact_types,
    )
    return FactAddedOut(fact=fact_out(fact), superseded=superseded)


@router.delete("/users/{user_id}/facts/{fact_id}", response_model=DeletedOut, responses=FACT_ERRORS)
@in_thread
def forget(user_id: UserId, fact_id: FactId, svc: Svc, who: Who) -> DeletedOut:
    """Forget a fact for good: it and the versions it superseded are deleted, not hidden."""
    visible_fact(svc.store, who, user_id, fact_id, "path.fact_id")
    deleted = svc.store.forget_fact(who.tenant_id, user_id, fact_id, visible_types=who.fact_types)
    if not deleted:  # forgotten by a concurrent request since the check above
        raise NotFoundError(f"unknown fact {fact_id!r}", field="path.fact_id")
    return DeletedOut(deleted=deleted)


@router.post("/facts/sweep", response_model=SweepOut, responses=FACT_ERRORS)
@in_thread
def sweep(svc: Svc, who: Who) -> SweepOut:
    """Purge this tenant's expired facts now (the service also sweeps on a timer)."""
    deleted = svc.store.sweep_expired(tenant=who.tenant_id)
    svc.metrics.facts_swept.inc(deleted)
    return SweepOut(deleted=deleted)
