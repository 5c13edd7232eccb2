"""The memory gym's config: :class:`GymConfig`, everything a world depends on, its size
presets (:data:`SIZES`) and the checks that turn a config into a resolved one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from memsifter.config import setting
from memsifter.data.gym_grammar import ATTRIBUTES
from memsifter.errors import DataError

LEVELS: tuple[str, ...] = ("single", "stale", "history")
USEFUL_AT: tuple[str, ...] = ("uniform", "early", "late")


@dataclass(frozen=True)
class GymConfig:
    """Everything a world depends on. ``size`` picks a preset (:data:`SIZES`); the fields left
    ``None`` take the preset's value."""

    seed: int = setting(0, help="world seed: one seed, one world, byte for byte")
    level: str = setting("stale", help="single | stale | history (see the module docstring)")
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

    def resolved(self) -> GymConfig:
        """The config with the preset filled in and every value checked (named errors)."""
        if self.level not in LEVELS:
            raise DataError(
                f"unknown gym level {self.level!r}; choose one of {LEVELS}", field="level"
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
        return d


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
