"""The memory gym's config: :class:`GymConfig`, everything a world depends on, its size
presets (:data:`SIZES`; the ``read`` level's own in :data:`READ_SIZES`) and the checks that
turn a config into a resolved one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from memsifter.config import setting
from memsifter.data.gym_grammar import ATTRIBUTES
from memsifter.data.gym_read_grammar import READ_ATTRIBUTES
from memsifter.errors import DataError

LEVELS: tuple[str, ...] = ("single", "stale", "history")  # the template-detector levels
READ_LEVEL = "read"  # the level where only reading pays (memsifter.data.gym_read)
ALL_LEVELS: tuple[str, ...] = (*LEVELS, READ_LEVEL)
# Fields only the read level has: left out of an older level's config dict, so its world.json
# stays the bytes it was before they existed.
READ_FIELDS: tuple[str, ...] = (
    "max_changes",
    "distractors_per_attribute",
    "when_questions",
    "prior_share",
    "heldout_share",
)
USEFUL_AT: tuple[str, ...] = ("uniform", "early", "late")


@dataclass(frozen=True)
class GymConfig:
    """Everything a world depends on. ``size`` picks a preset (:data:`SIZES`); the fields left
    ``None`` take the preset's value."""

    seed: int = setting(0, help="world seed: one seed, one world, byte for byte")
    level: str = setting("stale", help="single | stale | history | read (see docs/gym.md)")
    size: str = setting("small", help="preset: ci | small | medium | locomo")
    users: int | None = setting(None, help="users in all splits (default: the preset's)")
    attributes_per_user: int | None = setting(
        None, help="attributes a user has, of the five (default: the preset's)"
    )
    filler_sessions: int | None = setting(
        None, help="extra chit-chat or small-talk sessions a user (default: the preset's)"
    )
    stale_mentions: int | None = setting(
        None, help="stale mentions per attribute, stale and history levels (default: preset's)"
    )
    none_questions: int | None = setting(
        None, help="no-memory questions a user, s_0 = 1 (default: the preset's)"
    )
    earlier_questions: bool = setting(True, help='ask "before X" questions (stale, history)')
    long_sessions: bool = setting(False, help="four turns a session instead of two")
    useful_at: str = setting(
        "uniform",
        help="where the user's updates fall: uniform (no position habit pays), early (before "
        "every other session) or late (each latest update after them); early and late are "
        "worlds where a position is the answer, for CI's learning test",
    )
    split: tuple[float, float, float] = setting(
        (0.6, 0.2, 0.2), help="train, validation, test fractions of the users"
    )
    max_changes: int | None = setting(
        None, help="read: changes per attribute, drawn from 1..max_changes (default: preset's)"
    )
    distractors_per_attribute: int | None = setting(
        None,
        help="read: sessions per attribute that share the updates' cue words but are not the "
        "user's update (someone else's change, plan, hypothetical, denial, stale mention, "
        "someone else's value; kinds drawn to cover all) (default: the preset's)",
    )
    when_questions: int | None = setting(
        None, help="read: two-session 'when' questions a user (default: the preset's)"
    )
    prior_share: float | None = setting(
        None,
        help="read: share of attributes whose current value is the reader's no-memory prior "
        "(s_0 = 1 on their current questions) (default: the preset's)",
    )
    heldout_share: float | None = setting(
        None,
        help="read: chance that a validation or test user's draw (phrasing or value) is a "
        "held-out one that train users never see (default: the preset's)",
    )

    def resolved(self) -> GymConfig:
        """The config with the preset filled in and every value checked (named errors)."""
        if self.level not in ALL_LEVELS:
            raise DataError(
                f"unknown gym level {self.level!r}; choose one of {ALL_LEVELS}", field="level"
            )
        if self.useful_at not in USEFUL_AT:
            raise DataError(
                f"unknown useful_at {self.useful_at!r}; choose one of {USEFUL_AT}",
                field="useful_at",
            )
        if self.size not in SIZES:
            raise DataError(
                f"unknown gym size {self.size!r}; choose one of {tuple(SIZES)}", field="size"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise DataError(f"seed must be an integer >= 0, got {self.seed!r}", field="seed")
        if self.level == READ_LEVEL:
            cfg = _resolved_read(self)
        else:
            for name in READ_FIELDS:
                if getattr(self, name) is not None:
                    raise DataError(f"{name} is a setting of level 'read' only", field=name)
            preset = SIZES[self.size]
            cfg = replace(self, **{k: v for k, v in preset.items() if getattr(self, k) is None})
        _check_int(cfg.users, "users", 3)
        _check_int(cfg.attributes_per_user, "attributes_per_user", 1, len(ATTRIBUTES))
        _check_int(cfg.filler_sessions, "filler_sessions", 0, 100)
        _check_int(cfg.stale_mentions, "stale_mentions", 0, 10)
        _check_int(cfg.none_questions, "none_questions", 0, 10)
        split = tuple(cfg.split)
        if len(split) != 3 or any(not isinstance(x, (int, float)) or x < 0 for x in split):
            raise DataError(f"split must be three fractions >= 0, got {cfg.split!r}", field="split")
        if abs(sum(split) - 1.0) > 1e-6 or min(split) <= 0:
            raise DataError(
                f"split fractions must be > 0 and sum to 1, got {cfg.split!r}", field="split"
            )
        if any(round(f * cfg.users) < 1 for f in split):  # type: ignore[operator]
            raise DataError(
                f"{cfg.users} users leave a split empty at {cfg.split!r}", field="users"
            )
        return replace(cfg, split=tuple(float(x) for x in split))  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["split"] = list(d["split"])
        if self.level != READ_LEVEL:
            for name in READ_FIELDS:
                del d[name]
        return d


def _resolved_read(cfg: GymConfig) -> GymConfig:
    """The read level's preset filled in and its own fields checked (named errors)."""
    if cfg.useful_at != "uniform":
        raise DataError("level 'read' places events uniformly only", field="useful_at")
    preset = READ_SIZES[cfg.size]
    cfg = replace(cfg, **{k: v for k, v in preset.items() if getattr(cfg, k) is None})
    _check_int(cfg.attributes_per_user, "attributes_per_user", 3, len(ATTRIBUTES))
    _check_int(cfg.max_changes, "max_changes", 1, 3)
    _check_int(cfg.distractors_per_attribute, "distractors_per_attribute", 0, 20)
    _check_int(cfg.when_questions, "when_questions", 0, 4)
    for name in ("prior_share", "heldout_share"):
        x = getattr(cfg, name)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
            raise DataError(f"{name} must be a share in [0, 1], got {x!r}", field=name)
    # One attribute's history and each distractor may each need a value of their own, none of
    # them the prior: more than the smallest pool holds cannot be drawn without repeats.
    pool = min(len(a.values) for a in READ_ATTRIBUTES) - 1
    need = int(cfg.max_changes) + 1 + int(cfg.distractors_per_attribute)  # type: ignore[arg-type]
    if need > pool:
        raise DataError(
            f"max_changes + 1 + distractors_per_attribute = {need} values per attribute, more "
            f"than the smallest value pool holds ({pool})",
            field="distractors_per_attribute",
        )
    shares = {"prior_share": float(cfg.prior_share), "heldout_share": float(cfg.heldout_share)}  # type: ignore[arg-type]
    return replace(cfg, **shares)


def _check_int(value: Any, name: str, low: int, high: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise DataError(f"{name} must be an integer {bound}, got {value!r}", field=name)


# Presets: sessions a user = attributes x (events per attribute) + filler.
SIZES: dict[str, dict[str, int]] = {
    "ci": {
        "users": 60,
        "attributes_per_user": 1,
        "filler_sessions": 1,
        "stale_mentions": 1,
        "none_questions": 0,
    },
    "small": {
        "users": 400,
        "attributes_per_user": 2,
        "filler_sessions": 1,
        "stale_mentions": 1,
        "none_questions": 1,
    },
    "medium": {
        "users": 600,
        "attributes_per_user": 3,
        "filler_sessions": 2,
        "stale_mentions": 2,
        "none_questions": 1,
    },
    "locomo": {
        "users": 400,
        "attributes_per_user": 5,
        "filler_sessions": 6,
        "stale_mentions": 2,
        "none_questions": 2,
    },
}

# The read level's presets: sessions a user = attributes x (2 or 3 updates + distractors) +
# filler; two turns a session keep a medium prompt near 1k tokens. 1,000 users leave the test
# split 200 users and over 400 memory questions. stale_mentions is not used at this level (a
# stale mention is one of the distractor kinds).
READ_SIZES: dict[str, dict[str, int | float]] = {
    "ci": {
        "users": 60,
        "attributes_per_user": 3,
        "filler_sessions": 1,
        "stale_mentions": 0,
        "none_questions": 1,
        "max_changes": 1,
        "distractors_per_attribute": 1,
        "when_questions": 1,
        "prior_share": 0.3,
        "heldout_share": 0.1,
    },
    "small": {
        "users": 1000,
        "attributes_per_user": 3,
        "filler_sessions": 1,
        "stale_mentions": 0,
        "none_questions": 1,
        "max_changes": 2,
        "distractors_per_attribute": 2,
        "when_questions": 2,
        "prior_share": 0.3,
        "heldout_share": 0.1,
    },
    "medium": {
        "users": 1000,
        "attributes_per_user": 4,
        "filler_sessions": 1,
        "stale_mentions": 0,
        "none_questions": 1,
        "max_changes": 2,
        "distractors_per_attribute": 3,
        "when_questions": 2,
        "prior_share": 0.3,
        "heldout_share": 0.1,
    },
    "locomo": {
        "users": 1000,
        "attributes_per_user": 5,
        "filler_sessions": 2,
        "stale_mentions": 0,
        "none_questions": 2,
        "max_changes": 2,
        "distractors_per_attribute": 4,
        "when_questions": 2,
        "prior_share": 0.3,
        "heldout_share": 0.1,
    },
}
