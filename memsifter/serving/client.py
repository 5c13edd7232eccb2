"""A small typed client for the recall service (httpx, sync).

    client = MemSifterClient("http://localhost:8080", api_key=os.environ["MEMSIFTER_DEMO_KEY"])
    client.ingest_sessions("alice", [SessionIn(id="s1", turns=[TurnIn(speaker="alice", ...)])])
    hits = client.recall("alice", "what is my dog called?", top_k=3).hits

Responses are the service's own pydantic models (``memsifter.serving.schemas``). A non-2xx
answer raises ``ServiceError`` carrying the status, the error body and the request id.
Pass ``http=`` to reuse a client (connection pools, a test client, custom transports).

Ids go into URL paths percent-encoded, ``/`` included: a session id ``conv/7`` is sent as
``conv%2F7``, so no client or proxy on the way can read its segments as path structure. Every
id is first checked by the rule the server applies to it (``InvalidIdError`` names the id and
the rule), so an id such as ``..``, which an HTTP library would resolve as a dot segment and
turn ``DELETE …/sessions/..`` into a delete of the user, never leaves the client; a segment
that is only dots is percent-encoded as well, in case a rule ever admits one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from memsifter.errors import MemSifterError
from memsifter.serving.schemas import (
    FACT_ID_PATTERN,
    SESSION_ID_MAX_CHARS,
    SESSION_ID_PATTERN,
    USER_ID_PATTERN,
    ContextIn,
    ContextOut,
    DeletedOut,
    ErrorResponse,
    FactAddedOut,
    FactIn,
    FactListOut,
    FactOut,
    FactPatch,
    HealthOut,
    IngestOut,
    IngestSessionsIn,
    IngestTurnsIn,
    RankIn,
    RankOut,
    RecallIn,
    RecallOut,
    RerankIn,
    RerankOut,
    SessionIn,
    SessionListOut,
    SessionOut,
    SweepOut,
    TurnIn,
)

M = TypeVar("M", bound=BaseModel)


class ServiceError(MemSifterError):
    def __init__(self, status: int, body: ErrorResponse | None, text: str) -> None:
        self.status = status
        self.body = body
        self.request_id = body.request_id if body else None
        detail = body.error.message if body else text[:500]
        fields = ", ".join(f.field for f in body.error.fields) if body else ""
        super().__init__(f"HTTP {status}: {detail}" + (f" [fields: {fields}]" if fields else ""))


class InvalidIdError(MemSifterError, ValueError):
    """An id the server would refuse, refused before the request is sent."""


_RULES = {
    "user id": (re.compile(USER_ID_PATTERN), 128),
    "session id": (re.compile(SESSION_ID_PATTERN), SESSION_ID_MAX_CHARS),
    "fact id": (re.compile(FACT_ID_PATTERN), 36),
}


def _seg(value: str, kind: str) -> str:
    """One path segment: ``value`` checked by the server's rule for ``kind``, then every
    reserved character, ``/`` included, percent-encoded (and a dots-only value too: ``.`` is
    unreserved, so ``quote`` would leave a dot segment for the URL parser to resolve)."""
    pattern, longest = _RULES[kind]
    if not isinstance(value, str) or len(value) > longest or not pattern.fullmatch(value):
        raise InvalidIdError(
            f"invalid {kind} {value!r}: it must match {pattern.pattern} (at most {longest} "
            "characters); nothing was sent"
        )
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) == {"."} else encoded


class MemSifterClient:
    def __init__(
        self,
        base_url: str = "http://localhost:8080",
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own = http is None
        self.http = http or httpx.Client(base_url=base_url, timeout=timeout_s)
        self.headers = headers

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> MemSifterClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        model: type[M],
        body: BaseModel | None = None,
        params: dict[str, Any] | None = None,
    ) -> M:
        response = self.http.request(
            method,
            path,
            headers=self.headers,
            params=params,
            json=body.model_dump(mode="json", exclude_unset=True) if body is not None else None,
        )
        if response.status_code >= 400:
            try:
                error = ErrorResponse.model_validate(response.json())
            except ValueError:  # not JSON, or not our error shape (a proxy in between)
                error = None
            raise ServiceError(response.status_code, error, response.text)
        return model.model_validate(response.json())

    # -- stateless

    def rank(
        self,
        question: str,
        sessions: Sequence[SessionIn],
        *,
        question_date: str | None = None,
        top_k: int | None = None,
    ) -> RankOut:
        body = RankIn(
            question=question, sessions=list(sessions), question_date=question_date, top_k=top_k
        )
        return self._call("POST", "/v1/rank", RankOut, body)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_n: int | None = None,
        return_documents: bool = True,
    ) -> RerankOut:
        body = RerankIn(
            query=query, documents=list(documents), top_n=top_n, return_documents=return_documents
        )
        return self._call("POST", "/v1/rerank", RerankOut, body)

    # -- sessions

    def ingest_sessions(
        self, user: str, sessions: Sequence[SessionIn], *, replace: bool = False
    ) -> IngestOut:
        body = IngestSessionsIn(sessions=list(sessions), replace=replace)
        return self._call("POST", f"/v1/users/{_seg(user, 'user id')}/sessions", IngestOut, body)

    def ingest_turns(
        self, user: str, turns: Sequence[TurnIn], *, session_prefix: str | None = None
    ) -> IngestOut:
        body = IngestTurnsIn(turns=list(turns), session_prefix=session_prefix)
        return self._call("POST", f"/v1/users/{_seg(user, 'user id')}/turns", IngestOut, body)

    def list_sessions(self, user: str, *, limit: int = 100, offset: int = 0) -> SessionListOut:
        params = {"limit": limit, "offset": offset}
        return self._call(
            "GET", f"/v1/users/{_seg(user, 'user id')}/sessions", SessionListOut, params=params
        )

    def get_session(self, user: str, session_id: str) -> SessionOut:
        return self._call(
            "GET",
            f"/v1/users/{_seg(user, 'user id')}/sessions/{_seg(session_id, 'session id')}",
            SessionOut,
        )

    def delete_session(self, user: str, session_id: str) -> DeletedOut:
        return self._call(
            "DELETE",
            f"/v1/users/{_seg(user, 'user id')}/sessions/{_seg(session_id, 'session id')}",
            DeletedOut,
        )

    def delete_user(self, user: str) -> DeletedOut:
        # The server requires the id twice for this one delete (?confirm=<user_id>).
        return self._call(
            "DELETE", f"/v1/users/{_seg(user, 'user id')}", DeletedOut, params={"confirm": user}
        )

    # -- recall and context

    def recall(
        self, user: str, question: str, *, top_k: int = 5, question_date: str | None = None
    ) -> RecallOut:
        body = RecallIn(question=question, top_k=top_k, question_date=question_date)
        return self._call("POST", f"/v1/users/{_seg(user, 'user id')}/recall", RecallOut, body)

    def context(
        self,
        user: str,
        question: str,
        budget_tokens: int,
        *,
        question_date: str | None = None,
        page_in_k: int | None = None,
        recent_turns: int | None = None,
    ) -> ContextOut:
        body = ContextIn(
            question=question,
            budget_tokens=budget_tokens,
            question_date=question_date,
            page_in_k=page_in_k,
            recent_turns=recent_turns,
        )
        return self._call("POST", f"/v1/users/{_seg(user, 'user id')}/context", ContextOut, body)

    # -- facts

    def remember(
        self,
        user: str,
        type: str,
        subject: str,
        text: str,
        *,
        importance: float = 0.5,
        expires_at: datetime | None = None,
    ) -> FactAddedOut:
        body = FactIn.model_validate(
            {
                "type": type,
                "subject": subject,
                "text": text,
                "importance": importance,
                "expires_at": expires_at,
            }
        )
        return self._call("POST", f"/v1/users/{_seg(user, 'user id')}/facts", FactAddedOut, body)

    def facts(self, user: str) -> FactListOut:
        return self._call("GET", f"/v1/users/{_seg(user, 'user id')}/facts", FactListOut)

    def get_fact(self, user: str, fact_id: str) -> FactOut:
        return self._call(
            "GET", f"/v1/users/{_seg(user, 'user id')}/facts/{_seg(fact_id, 'fact id')}", FactOut
        )

    def correct(self, user: str, fact_id: str, patch: FactPatch) -> FactAddedOut:
        return self._call(
            "PATCH",
            f"/v1/users/{_seg(user, 'user id')}/facts/{_seg(fact_id, 'fact id')}",
            FactAddedOut,
            patch,
        )

    def forget(self, user: str, fact_id: str) -> DeletedOut:
        return self._call(
            "DELETE",
            f"/v1/users/{_seg(user, 'user id')}/facts/{_seg(fact_id, 'fact id')}",
            DeletedOut,
        )

    def sweep(self) -> SweepOut:
        return self._call("POST", "/v1/facts/sweep", SweepOut)

    # -- operations

    def health(self) -> HealthOut:
        return self._call("GET", "/healthz", HealthOut)
