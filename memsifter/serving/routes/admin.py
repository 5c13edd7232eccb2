"""Key administration: create, list and revoke tenants' API keys without a restart.

Guarded by the admin key (``admin:`` in the config), never by a tenant key: a tenant cannot
mint keys for itself or anyone else. With no admin key configured the whole API answers 404.
A revoked key fails from the next request on: keys are looked up per request, not cached.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memsifter.serving.deps import Svc, in_thread
from memsifter.serving.errors import NotFoundError, ServeError
from memsifter.serving.schemas import (
    USER_ID_PATTERN,
    ErrorResponse,
    KeyCreatedOut,
    KeyIn,
    KeyListOut,
    KeyOut,
)
from memsifter.serving.store import hash_key
from memsifter.serving.store.records import ApiKeyInfo

router = APIRouter(prefix="/v1/admin", tags=["admin"])
ERRORS: dict[int | str, dict[str, Any]] = {
    s: {"model": ErrorResponse} for s in (401, 404, 422, 503)
}
# A body that is not UTF-8 or not JSON (400) or over limits.max_body_bytes (413) is refused
# before the route runs, by the request middleware and the validation handler.
BODY_ERRORS: dict[int | str, dict[str, Any]] = {**ERRORS, 400: ERRORS[401], 413: ERRORS[401]}
# Named apart from the tenant scheme: OpenAPI keys security schemes by name.
_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminKey",
    description="The admin key: `Authorization: Bearer KEY`",
)


async def admin(
    svc: Svc, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    settings = svc.config.admin
    expected = settings.key_sha256
    if expected is None and settings.key_env:
        plain = os.environ.get(settings.key_env)
        expected = hash_key(plain) if plain else None
    if not expected:
        raise NotFoundError(
            "the admin API is off: configure admin.key_env (and set that variable) or "
            "admin.key_sha256"
        )
    given = credentials.credentials if credentials is not None else ""
    # Constant-time, so response timing says nothing about how much of a guess was right.
    if not given or not hmac.compare_digest(hash_key(given), expected.lower()):
        raise ServeError("invalid admin key", field="header.Authorization", status=401)


Admin = Annotated[None, Depends(admin)]
TenantId = Annotated[str, Path(pattern=USER_ID_PATTERN, description="the tenant's id")]
# Key ids are a 32-bit integer column: a larger id cannot exist, and would overflow the driver.
KEY_ID_MAX = 2**31 - 1


def key_out(info: ApiKeyInfo) -> KeyOut:
    return KeyOut.model_validate(asdict(info))  # the same fields; tuples become lists


@router.post(
    "/tenants/{tenant_id}/keys",
    status_code=201,
    response_model=KeyCreatedOut,
    responses=BODY_ERRORS,
)
@in_thread
def create_key(tenant_id: TenantId, body: KeyIn, svc: Svc, _: Admin) -> KeyCreatedOut:
    """A new key for the tenant (created if new). The key is in this response only."""
    info, key = svc.store.create_api_key(tenant_id, agent=body.agent, fact_types=body.fact_types)
    return KeyCreatedOut(key=key, info=key_out(info))


@router.get("/tenants/{tenant_id}/keys", response_model=KeyListOut, responses=ERRORS)
@in_thread
def list_keys(tenant_id: TenantId, svc: Svc, _: Admin) -> KeyListOut:
    keys = svc.store.list_api_keys(tenant_id)
    if keys is None:
        raise NotFoundError(f"unknown tenant {tenant_id!r}", field="path.tenant_id")
    return KeyListOut(tenant_id=tenant_id, keys=[key_out(k) for k in keys])


@router.delete("/keys/{key_id}", response_model=KeyOut, responses=ERRORS)
@in_thread
def revoke_key(key_id: Annotated[int, Path(ge=1, le=KEY_ID_MAX)], svc: Svc, _: Admin) -> KeyOut:
    """Revoke a key: requests with it get 401 from now on. Returns what was revoked."""
    info = svc.store.revoke_api_key(key_id)
    svc.principals.clear()  # this worker refuses the key from the next request on
    if info is None:
        raise NotFoundError(f"no key with id {key_id}", field="path.key_id")
    return key_out(info)
