"""A small sample conversation for a first ``curl`` against a fresh service
(``memsifter serve --seed-sample``): user ``alice`` with a few dated sessions and one fact."""

from __future__ import annotations

from datetime import datetime

from memsifter.data.types import Session, Turn
from memsifter.serving.memory import MemoryService, session_from_input
from memsifter.serving.store.records import Principal

SAMPLE_USER = "alice"

_SESSIONS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "2024-03-02",
        "2024-03-02T18:00:00",
        (
            ("alice", "I finally adopted a dog! A golden retriever puppy named Max."),
            ("assistant", "Congratulations! How old is Max?"),
            ("alice", "Ten weeks. He already chewed my running shoes."),
            ("assistant", "Puppies love shoes. Have you thought about training classes?"),
            ("alice", "Yes, puppy school starts next Saturday at the park."),
        ),
    ),
    (
        "2024-04-14",
        "2024-04-14T09:30:00",
        (
            ("alice", "I signed up for the Lisbon half marathon in October."),
            ("assistant", "Great goal. What is your current weekly mileage?"),
            ("alice", "About 20 km, mostly slow runs along the river."),
            ("assistant", "Add one tempo run a week and a long run on Sundays."),
        ),
    ),
    (
        "2024-05-20",
        "2024-05-20T20:15:00",
        (
            ("alice", "My sister Clara is getting married in Porto next June."),
            ("assistant", "How lovely! Are you in the wedding party?"),
            ("alice", "I'm the maid of honour, so I have to plan the bachelorette weekend."),
            ("assistant", "Fun! A wine tour in the Douro valley could be a good idea."),
        ),
    ),
    (
        "2024-06-03",
        "2024-06-03T12:00:00",
        (
            ("alice", "Max graduated from puppy school today, top of his class!"),
            ("assistant", "Well done, Max! What was the hardest command?"),
            ("alice", "Stay. He still wants to chase every pigeon."),
        ),
    ),
)


def sample_sessions() -> list[Session]:
    out = []
    for sid, date, turns in _SESSIONS:
        when = datetime.fromisoformat(date)
        out.append(
            session_from_input(sid, [Turn(speaker, text) for speaker, text in turns], when, None)
        )
    return out


def seed_sample(memory: MemoryService, tenant: str) -> int:
    """Store the sample for ``tenant``'s user ``alice`` (replacing an earlier seed); returns
    the number of sessions."""
    who = Principal(tenant_id=tenant)
    sessions = sample_sessions()
    memory.ingest_sessions(who, SAMPLE_USER, sessions, replace=True)
    memory.store.add_fact(
        tenant,
        SAMPLE_USER,
        type="entity",
        subject="pet",
        text="Alice has a golden retriever named Max.",
        importance=0.8,
    )
    return len(sessions)
