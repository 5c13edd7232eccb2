"""Operations: liveness, readiness (database reachable) and Prometheus metrics. No auth: they
reveal nothing about any tenant."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from memsifter.serving.deps import Svc, in_thread
from memsifter.serving.schemas import HealthOut

router = APIRouter(tags=["operations"])
logger = logging.getLogger(__name__)


@router.get("/healthz", response_model=HealthOut)
async def healthz(svc: Svc) -> HealthOut:
    return HealthOut(status="ok", ranker=svc.ranker.name)


@router.get("/readyz", response_model=HealthOut, responses={503: {"model": HealthOut}})
@in_thread
def readyz(svc: Svc) -> HealthOut | JSONResponse:
    try:
        svc.store.ping()
    except Exception:  # any driver error means "not ready"; the log has the cause
        logger.exception("readiness check failed")
        body = HealthOut(status="database unavailable", ranker=svc.ranker.name)
        return JSONResponse(body.model_dump(), status_code=503)
    return HealthOut(status="ready", ranker=svc.ranker.name)


@router.get("/metrics", include_in_schema=False)
@in_thread
def metrics(svc: Svc) -> Response:
    return Response(svc.metrics.render(), media_type=svc.metrics.content_type)
