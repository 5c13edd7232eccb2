"""The proxy ranker's contract with the world: the prompt it is shown and the answer it gives.

Training, evaluation and serving import ``PromptBuilder``/``build_messages`` to ask and
``parse_ranking`` to read, so all three agree on ids, format and failure modes.
"""

from memsifter.ranker.parse import ParsedRanking, ParseErrorKind, parse_ranking
from memsifter.ranker.prompt import BuiltPrompt, PromptBuilder, build_messages

__all__ = [
    "BuiltPrompt",
    "ParseErrorKind",
    "ParsedRanking",
    "PromptBuilder",
    "build_messages",
    "parse_ranking",
]
