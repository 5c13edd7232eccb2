"""The service's error type: every refusal carries the HTTP status and the field at fault, so
the app can answer a 4xx that names it and never a 500."""

from __future__ import annotations

from memsifter.errors import MemSifterError


class ServeError(MemSifterError):
    """A request the service refuses. ``field`` is a path such as ``body.sessions[2].id``."""

    def __init__(self, message: str, *, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status


class NotFoundError(ServeError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=404)


class ConflictError(ServeError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=409)


class UnavailableError(ServeError):
    """A dependency (the proxy backend, the database) failed; the client may retry."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field, status=503)
