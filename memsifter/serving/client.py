"""A small typed client for the recall service (httpx, sync).

    client = MemSifterClient("http://localhost:8080", api_key=os.environ["MEMSIFTER_DEMO_KEY"])
    client.ingest_sessions("alice", [SessionIn(id="s1", turns=[TurnIn(speaker="alice", ...)])])
    hits = client.recall("alice", "what is my dog called?", top_k=3).hits

Responses are the service's own pydantic models (``memsifter.serving.schemas``). A non-2xx
answer raises ``ServiceError`` carrying the status, the error body and the request id.
Pass ``http=`` to reuse a client (connection pools, a test client, custom transports).

Ids go into URL paths percent-encoded, ``/`` included: a session id ``conv/7`` is sent as
``conv%2F7``, so no client or proxy on the way can read its segments as path structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from memsifter.errors import MemSifterError
from memsifter.serving.schemas import (
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


def _seg(value: str) -> str:
    """One path segment: every reserved character, ``/`` included, percent-encoded."""
    return quote(value, safe="")


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

    # -- sessions

    def ingest_sessions(
        self, user: str, sessions: Sequence[SessionIn], *, replace: bool = False
    ) -> IngestOut:
        body = IngestSessionsIn(sessions=list(sessions), replace=replace)
        return self._call("POST", f"/v1/users/{_seg(user)}/sessions", IngestOut, body)

    def ingest_turns(
        self, user: str, turns: Sequence[TurnIn], *, session_prefix: str | None = None
    ) -> IngestOut:
        body = IngestTurnsIn(turns=list(turns), session_prefix=session_prefix)
        return self._call("POST", f"/v1/users/{_seg(user)}/turns", IngestOut, body)

    def list_sessions(self, user: str, *, limit: int = 100, offset: int = 0) -> SessionListOut:
        params = {"limit": limit, "offset": offset}
        return self._call("GET", f"/v1/users/{_seg(user)}/sessions", SessionListOut, params=params)

    def get_session(self, user: str, session_id: str) -> SessionOut:
        return self._call("GET", f"/v1/users/{_seg(user)}/sessions/{_seg(session_id)}", SessionOut)

    def delete_session(self, user: str, session_id: str) -> DeletedOut:
        return self._call(
            "DELETE", f"/v1/users/{_seg(user)}/sessions/{_seg(session_id)}", DeletedOut
        )

    def delete_user(self, user: str) -> DeletedOut:
        return self._call("DELETE", f"/v1/users/{_seg(user)}", DeletedOut)

    # -- recall and context

    def recall(
        self, user: str, question: str, *, top_k: int = 5, question_date: str | None = None
    ) -> RecallOut:
        body = RecallIn(question=question, top_k=top_k, question_date=question_date)
        return self._call("POST", f"/v1/users/{_seg(user)}/recall", RecallOut, body)

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
        return self._call("POST", f"/v1/users/{_seg(user)}/context", ContextOut, body)

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
        return self._call("POST", f"/v1/users/{_seg(user)}/facts", FactAddedOut, body)

    def facts(self, user: str) -> FactListOut:
        return self._call("GET", f"/v1/users/{_seg(user)}/facts", FactListOut)

    def get_fact(self, user: str, fact_id: str) -> FactOut:
        return self._call("GET", f"/v1/users/{_seg(user)}/facts/{_seg(fact_id)}", FactOut)

    def correct(self, user: str, fact_id: str, patch: FactPatch) -> FactAddedOut:
        return self._call(
            "PATCH", f"/v1/users/{_seg(user)}/facts/{_seg(fact_id)}", FactAddedOut, patch
        )

    def forget(self, user: str, fact_id: str) -> DeletedOut:
        return self._call("DELETE", f"/v1/users/{_seg(user)}/facts/{_seg(fact_id)}", DeletedOut)

    def sweep(self) -> SweepOut:
        return self._call("POST", "/v1/facts/sweep", SweepOut)

    # -- operations

    def health(self) -> HealthOut:
        return self._call("GET", "/healthz", HealthOut)
