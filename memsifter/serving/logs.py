"""Structured (JSON lines) logs with the request id of the request being served.

The id lives in a context variable set by the app's middleware; ``RequestContextFilter`` copies
it (and the tenant, once authenticated) onto every record, so a log line from deep inside the
store or the ranker can still be tied to its request. ``configure_logging`` is for the
``memsifter serve`` process; a library user keeps their own logging setup.
"""

from __future__ import annotations

import json
import logging
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("memsifter_request_id", default=None)
tenant_var: ContextVar[str | None] = ContextVar("memsifter_tenant", default=None)

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's ANSI-coloured copy of the message
}


class RequestContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id_var.get()
        if getattr(record, "tenant", None) is None:
            record.tenant = tenant_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    handler.setLevel(level.upper())  # some libraries (bm25s) set DEBUG on their own loggers
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("alembic").setLevel(logging.WARNING)  # one line per plugin at startup
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        # Our middleware logs every request with its id; uvicorn's own access line would be a
        # second, id-less copy.
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = name != "uvicorn.access"
