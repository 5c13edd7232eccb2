"""Splitting a source into train, validation and test, by conversation.

**By conversation, never by question.** Questions about one conversation share
its sessions; splitting them would let the proxy see held-out evidence in training. ``train``
trains; ``validation`` chooses (checkpoints, early stopping, recipe options); ``test`` is only
reported and never used to choose anything. A source lists ``validation_conversations`` and
``test_conversations`` (ids or 0-based indexes; ``train_conversations`` too, else train is the
rest), or gives ``validation_fraction`` / ``test_fraction`` for a seeded hash split, which suits
LongMemEval, where every question has its own haystack (its "conversation" is the question id).
The hash depends only on the seed and the conversation id, so the same question lands in the same
split in LongMemEval S and M, and adding data never moves an old conversation. LoCoMo with no
lists defaults to conversations 0-6 train, 7 validation, 8-9 test. A dataset that ships its own
split (the gym; the MemSifter release's train and test files) keeps it; where that split has no
validation (the release), ``validation_fraction`` alone carves one from its train.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from memsifter.data import MemoryDataset
from memsifter.data.splits import LOCOMO_TEST, LOCOMO_VALIDATION, SPLITS
from memsifter.data.types import Query
from memsifter.errors import DataError, UnknownNameError
from memsifter.training.rldata.recipe import SourceSettings


@dataclass(frozen=True)
class ConversationSplit:
    """Which conversations of one source went where."""

    source: str
    method: str  # listed | hash | locomo-default | dataset | dataset+hash
    train: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...] = ()
    unused: tuple[str, ...] = ()  # listed in no split (all three lists given)
    fractions: dict[str, float] | None = None  # hash split: held-out fraction per role

    def of(self, split: str) -> tuple[str, ...]:
        return {"train": self.train, "validation": self.validation, "test": self.test}[split]

    def assignment(self) -> dict[str, str]:
        """Conversation id -> split, for the conversations in a split."""
        return {c: split for split in SPLITS for c in self.of(split)}


def conversation_of(query: Query) -> str:
    """The conversation ``query`` belongs to; a query without a conversation id is its own."""
    return query.conversation_id or query.qid


def _conversation_keys(dataset: MemoryDataset) -> list[str]:
    keys = list(dataset.conversations)
    seen = set(keys)
    for q in dataset.queries:
        c = conversation_of(q)
        if c not in seen:
            keys.append(c)
            seen.add(c)
    return keys


def _resolve(raw: Sequence[int | str], keys: list[str], source: str, key: str) -> list[str]:
    out = []
    known = set(keys)
    for item in raw:
        text = str(item)
        if text in known:
            out.append(text)
        elif text.isdigit() and int(text) < len(keys):
            out.append(keys[int(text)])
        else:
            raise UnknownNameError(
                f"source {source!r}, {key}: unknown conversation {item!r}; known: "
                f"{', '.join(keys[:12])}{' …' if len(keys) > 12 else ''} "
                f"(or indexes 0..{len(keys) - 1})"
            )
    return list(dict.fromkeys(out))


def hash_fraction(seed: int, conversation: str) -> float:
    """A uniform number in [0, 1) fixed by the seed and the conversation id."""
    digest = hashlib.sha256(f"{seed}:{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_conversations(
    dataset: MemoryDataset, source: SourceSettings, seed: int = 0
) -> ConversationSplit:
    """Assign every conversation of ``dataset`` to train, validation or test (module doc)."""
    keys = _conversation_keys(dataset)
    own = dataset.splits
    if (
        own
        and source.validation_fraction is not None
        and source.test_fraction is None
        and "validation" not in own.values()
    ):
        # A dataset that ships train and test only (the MemSifter release): validation is a
        # seeded hash share of its own train, and its test stays test.
        v = source.validation_fraction
        where = {
            k: "validation"
            if own.get(k) == "train" and hash_fraction(seed, k) < v
            else own.get(k, "unused")
            for k in keys
        }
        return ConversationSplit(
            source=source.name,
            method="dataset+hash",
            **{s: tuple(k for k in keys if where[k] == s) for s in SPLITS},
            unused=tuple(k for k in keys if where[k] == "unused"),
            fractions={"validation": v},
        )
    if source.validation_fraction is not None or source.test_fraction is not None:
        v, t = source.validation_fraction or 0.0, source.test_fraction or 0.0
        where = {}
        for k in keys:
            h = hash_fraction(seed, k)
            where[k] = "test" if h < t else "validation" if h < t + v else "train"
        return ConversationSplit(
            source=source.name,
            method="hash",
            train=tuple(k for k in keys if where[k] == "train"),
            validation=tuple(k for k in keys if where[k] == "validation"),
            test=tuple(k for k in keys if where[k] == "test"),
            fractions={"validation": v, "test": t},
        )
    raw = {
        "train": source.train_conversations,
        "validation": source.validation_conversations,
        "test": source.test_conversations,
    }
    method = "listed"
    if all(v is None for v in raw.values()) and dataset.splits:  # the gym (see SourceSettings)
        where = {k: dataset.splits.get(k, "unused") for k in keys}
        return ConversationSplit(
            source=source.name,
            method="dataset",
            **{s: tuple(k for k in keys if where[k] == s) for s in ("train", "validation", "test")},
            unused=tuple(k for k in keys if where[k] == "unused"),
        )
    if all(v is None for v in raw.values()):  # LoCoMo (see SourceSettings)
        if len(keys) != 10:
            raise DataError(
                f"source {source.name!r}: the default LoCoMo split (conversations 0-6 train, 7 "
                f"validation, 8-9 test) is for the 10 conversations of locomo10.json, but this "
                f"file has {len(keys)}; list validation_conversations / test_conversations",
                file=source.path,
                field="test_conversations",
            )
        raw = {"train": None, "validation": list(LOCOMO_VALIDATION), "test": list(LOCOMO_TEST)}
        method = "locomo-default"
    lists = {
        k: _resolve(v, keys, source.name, f"{k}_conversations") if v else [] for k, v in raw.items()
    }
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        both = sorted(set(lists[a]) & set(lists[b]))
        if both:
            raise DataError(
                f"source {source.name!r}: conversations in both {a} and {b}: {both}",
                field=f"{b}_conversations",
            )
    if raw["train"] is None:
        held = set(lists["validation"]) | set(lists["test"])
        lists["train"] = [k for k in keys if k not in held]
    used = {c for v in lists.values() for c in v}
    return ConversationSplit(
        source=source.name,
        method=method,
        train=tuple(lists["train"]),
        validation=tuple(lists["validation"]),
        test=tuple(lists["test"]),
        unused=tuple(k for k in keys if k not in used),
    )


__all__ = ["ConversationSplit", "conversation_of", "hash_fraction", "split_conversations"]
