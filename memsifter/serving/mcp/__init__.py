"""The memory as Model Context Protocol tools (the official ``mcp`` SDK, 2.x): ``recall``,
``remember``, ``add_fact``, ``facts`` and ``forget``, each acting for one tenant key and one user.

Two transports serve the same tools (docs/mcp.md):

* **stdio** (``memsifter mcp --user U``, ``stdio``): one process per assistant, the key read
  from an environment variable, the user fixed for the process. The key is checked at start
  and again at every call (through the service's ``auth_cache_s`` cache), so a key revoked while
  the process runs is refused as on HTTP. No reply line exceeds ``MAX_STDIO_LINE_BYTES`` and no
  request line over ``limits.max_body_bytes`` is held in memory (each is answered with a named
  JSON-RPC error instead), and the process serves an existing memory: it never creates one
  unless told to.
* **Streamable HTTP** at ``/mcp`` on the service (``streamable_http``): every request names its
  key (``Authorization: Bearer KEY``, checked by the same dependency as every route, rate limit
  included) and its user (``X-MemSifter-User``), so a refusal there is the service's JSON error
  (401, 422, 429, 503) before the MCP layer sees the request. The transport is stateless with
  JSON responses: no session lives in one worker's memory, so ``--workers N`` and replicas
  behind a load balancer serve MCP clients like any other.

The tools (``tools``) are thin, like the routes: their arguments are validated by the routes'
request models (``RecallIn``, ``FactIn`` ...) or models built from them, so the argument contract
is the HTTP body's, strict integers included, and they call the same ``MemoryService`` and
``Store`` methods. A refusal (``ServeError``, a ``ValidationError``, an unknown argument or tool,
the database down) is a tool result with ``isError`` whose text is the service's error body
(``errors.error_body``: at most 20 fields plus their count, the whole reply that carries it at
most 16 KB); the server goes on.
"""

from __future__ import annotations

from memsifter.serving.mcp.stdio import (
    DEFAULT_KEY_ENV,
    MAX_STDIO_LINE_BYTES,
    LineLimit,
    RequestLines,
    missing_memory,
    run_stdio,
)
from memsifter.serving.mcp.streamable_http import USER_HEADER, McpEndpoint
from memsifter.serving.mcp.tools import Caller, build_server

__all__ = [
    "DEFAULT_KEY_ENV",
    "MAX_STDIO_LINE_BYTES",
    "USER_HEADER",
    "Caller",
    "LineLimit",
    "McpEndpoint",
    "RequestLines",
    "build_server",
    "missing_memory",
    "run_stdio",
]
