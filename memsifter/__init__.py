"""MemSifter: a think-and-rank proxy that picks which past sessions a working LLM sees."""

from memsifter.data.types import Query, Ranking, Session, Turn
from memsifter.errors import DataError, MemSifterError

__all__ = ["DataError", "MemSifterError", "Query", "Ranking", "Session", "Turn"]
__version__ = "0.1.0"
