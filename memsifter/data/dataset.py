"""A loaded dataset: its queries, the pool of all sessions, and what the loader had to repair."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from memsifter.data.types import Query, Session


@dataclass
class LoadReport:
    """What a loader saw. Nothing is dropped silently: every oddity is counted here."""

    source: str
    n_questions: int = 0
    n_sessions: int = 0
    no_evidence_qids: list[str] = field(default_factory=list)
    repaired_evidence: Counter[str] = field(default_factory=Counter)
    unusable_evidence: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)  # anything else the loader had to decide

    @property
    def n_no_evidence(self) -> int:
        return len(self.no_evidence_qids)

    def summary(self) -> str:
        parts = [
            f"{self.source}: {self.n_questions} questions, {self.n_sessions} sessions",
            f"{self.n_no_evidence} questions without usable evidence (kept, excluded from "
            "retrieval metrics)",
        ]
        if self.repaired_evidence:
            parts.append(f"repaired evidence strings: {dict(self.repaired_evidence)}")
        if self.unusable_evidence:
            parts.append(f"unusable evidence strings: {dict(self.unusable_evidence)}")
        parts.extend(self.notes)
        return "; ".join(parts)


@dataclass
class MemoryDataset:
    """Queries plus the session pool they draw from (used for haystack padding)."""

    queries: list[Query]
    conversations: dict[str, tuple[Session, ...]]
    report: LoadReport
    # conversation id -> train | validation | test, for a dataset that defines its own split
    # (the memory gym splits by user); empty when the recipe must say
    splits: dict[str, str] = field(default_factory=dict)

    @property
    def sessions(self) -> dict[str, Session]:
        return {s.id: s for conv in self.conversations.values() for s in conv}

    def filter_conversations(self, ids: list[str] | None) -> MemoryDataset:
        """Keep only the named conversations (by id or 0-based index). Unknown ids are an error."""
        if not ids:
            return self
        keys = list(self.conversations)
        wanted: list[str] = []
        for raw in ids:
            if raw in self.conversations:
                wanted.append(raw)
            elif raw.isdigit() and int(raw) < len(keys):
                wanted.append(keys[int(raw)])
            else:
                from memsifter.errors import UnknownNameError

                raise UnknownNameError(
                    f"unknown conversation {raw!r}; known: {', '.join(keys)} "
                    f"(or indexes 0..{len(keys) - 1})"
                )
        keep = set(wanted)
        return MemoryDataset(
            queries=[q for q in self.queries if q.conversation_id in keep],
            conversations={k: v for k, v in self.conversations.items() if k in keep},
            report=self.report,
            splits={k: v for k, v in self.splits.items() if k in keep},
        )
