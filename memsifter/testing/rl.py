"""A tiny RL data recipe over the LoCoMo fixture, for runs of the whole training loop."""

from __future__ import annotations

from pathlib import Path

from memsifter.ranker.spec import PromptSpec
from memsifter.training.rldata.build import RLDataConfig, SourceSettings


def tiny_locomo_recipe(
    model: str | Path, locomo_path: str | Path, *, count: int = 4, completion_tokens: int = 32
) -> RLDataConfig:
    """Conversations 0-1 train (``count`` prompts kept), 2 validation, no test; pages of 2 turns
    in a 640-token window: small enough for a tiny model's loop to run in seconds."""
    return RLDataConfig(
        sources=[
            SourceSettings(
                name="locomo",
                path=str(locomo_path),
                count=count,
                train_conversations=[0, 1],
                validation_conversations=[2],
                test_conversations=[],
            )
        ],
        prompt=PromptSpec(
            model=str(model),
            window_tokens=640,
            completion_tokens=completion_tokens,
            unit="page",
            turns_per_page=2,
        ),
    )
