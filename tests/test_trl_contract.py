"""Dynamic sampling (``memsifter.training.dynamic_sampling``) overrides two private methods of
TRL's ``GRPOTrainer`` and rebuilds the batch the first returns. TRL may change either in any
release without notice, so ``pyproject.toml`` pins the TRL range it was tested with, and this
file fails loudly, naming what moved, when the installed TRL's methods change shape."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from memsifter.training.dynamic_sampling import _MERGED  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The keys TRL 1.16's batch may hold that dynamic sampling refuses (multimodal and tool
# batches), and the one it recomputes after a merge.
REFUSED = {
    "image_grid_thw", "image_position_ids", "image_sizes", "mm_token_type_ids", "num_images",
    "num_tiles", "pixel_attention_mask", "pixel_values", "spatial_shapes", "token_type_ids",
    "tool_mask",
}  # fmt: skip
RECOMPUTED = {"num_items_in_batch"}


def test_installed_trl_is_in_the_pinned_range() -> None:
    from packaging.requirements import Requirement

    # The train extra's line (tomllib is 3.11+; the project supports 3.10).
    (line,) = [
        x for x in (ROOT / "pyproject.toml").read_text().splitlines() if x.startswith("train")
    ]
    (req,) = [Requirement(r) for r in re.findall(r'"([^"]+)"', line) if r.startswith("trl")]
    # An upper bound: a release that moves the private methods must not install silently.
    assert any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier), (
        f"pin TRL with an upper bound (got {req.specifier or 'no range'}): dynamic sampling "
        "depends on its private methods"
    )
    assert req.specifier.contains(trl.__version__), (
        f"TRL {trl.__version__} is outside the tested range {req.specifier}"
    )


def test_private_method_signatures() -> None:
    from trl import GRPOTrainer

    got = {
        name: list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        for name in ("_generate_and_score_completions", "_calculate_rewards")
    }
    assert got == {
        "_generate_and_score_completions": ["self", "inputs"],
        "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    }


def test_generation_batch_keys_are_all_handled() -> None:
    """TRL's generation batch holds the keys it held when dynamic sampling was written: the ones
    merge_batches merges, recomputes or refuses by name. A new key fails here, not as a refusal
    in the middle of a run. The rewards still come from ``_calculate_rewards`` (our override
    records them there to find the zero-std groups)."""
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self._calculate_rewards(" in src
    literal = re.search(r"output = \{(.*?)\}", src, re.DOTALL)
    assert literal, "GRPOTrainer no longer builds its batch as `output = {...}`"
    keys = set(re.findall(r'"(\w+)":', literal.group(1)))
    keys |= set(re.findall(r'output\["(\w+)"\]\s*=', src))
    assert keys - _MERGED - RECOMPUTED - REFUSED == set(), "new keys in TRL's generation batch"
    assert _MERGED <= keys, "keys dynamic sampling merges that TRL no longer returns"
    assert {"prompt_ids", "completion_ids", "completion_mask", "advantages"} <= keys
