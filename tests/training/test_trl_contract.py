"""Dynamic sampling (``memsifter.training.dynamic_sampling``) overrides two private methods of
TRL's ``GRPOTrainer``, rebuilds the batch the first returns, and recomputes the metrics and the
completions table TRL fills as it generates. TRL may change any of these in any release without
notice, so ``pyproject.toml`` pins the TRL range it was tested with, and this file fails loudly,
naming what moved, when the installed TRL's methods, batch keys, metric names or completions
table change shape."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

trl = pytest.importorskip("trl")

from memsifter.training.dynamic_sampling import _MERGED  # noqa: E402
from memsifter.training.dynamic_sampling_metrics import (  # noqa: E402
    _LOG_KEYS,
    recomputed_metrics,
)

ROOT = Path(__file__).resolve().parents[2]
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


def _source(name: str) -> str:
    from trl import GRPOTrainer

    return inspect.getsource(getattr(GRPOTrainer, name))


def test_metric_names_are_all_recomputed_or_refused() -> None:
    """Every metric TRL logs per generation round by name is one dynamic sampling recomputes
    over the trained groups (or a tool metric: tool batches are refused). Reward functions'
    ``log_metric`` scalars are flushed under their own names (kept per round, by design)."""
    literal = re.compile(r'self\._metrics\[mode\]\[f?"([^"]+)"\]')
    logged = set()
    for name in ("_generate", "_generate_and_score_completions"):
        logged |= set(literal.findall(_source(name)))
    ours = recomputed_metrics(["{reward_func_name}"])
    tools = {"tools/call_frequency", "tools/failure_frequency"}
    assert logged - tools == ours, "TRL's per-round metrics changed"
    assert "self._metrics[mode][name].append(total / count)" in _source(
        "_generate_and_score_completions"
    ), "TRL no longer flushes log_metric scalars per round"


def test_row_facts_dynamic_sampling_recomputes_from() -> None:
    """The metrics are recomputed from the gathered rewards ``_calculate_rewards`` returns and
    from the same length and truncation tests ``_generate`` applies to the token lists."""
    assert "rewards_per_func = gather(rewards_per_func)" in _source("_calculate_rewards")
    gen = _source("_generate")
    for line in (
        "completion_lengths = torch.tensor([len(ids) for ids in completion_ids], device=device)",
        "eos_and_pad = [*self.eos_token_ids, self._tokenizer.pad_token_id]",
        "is_truncated = torch.tensor([ids[-1] not in eos_and_pad for ids in completion_ids]",
        "self.state.num_input_tokens_seen += (total_prompt_tokens + agg_completion_lengths.sum())",
    ):
        assert line in gen, f"GRPOTrainer._generate no longer has: {line}"
    score = _source("_generate_and_score_completions")
    assert "self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in score
    assert 'self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]' in score


def test_completions_table_keys() -> None:
    """The completions table (``_logs``) dynamic sampling swaps per round and refills with the
    trained rows: its keys, and that a round extends it with gathered, per-row values."""
    from trl import GRPOTrainer

    init = inspect.getsource(GRPOTrainer.__init__)
    literal = re.search(r"self\._logs = \{(.*?)\n        \}", init, re.DOTALL)
    assert literal, "GRPOTrainer no longer builds its completions table as `self._logs = {...}`"
    assert set(re.findall(r'"(\w+)":', literal.group(1))) == _LOG_KEYS
    score = _source("_generate_and_score_completions")
    for line in (
        'self._logs["prompt"].extend(gather_object(prompts))',
        'self._logs["advantages"].extend(all_process_advantages.tolist())',
        'self._logs["extra"][column].extend(gather_object(values))',
    ):
        assert line in score, f"GRPOTrainer no longer fills its table with: {line}"


def test_what_the_mean_scale_divides() -> None:
    """``grpo.scale_rewards: mean`` (``memsifter.training.mean_scale_trainer``) divides TRL's
    centred advantages under ``scale_rewards: none`` by group means it recomputes from the
    gathered rewards: TRL must still centre on the NaN-aware group mean of the weighted sum,
    leave ``none`` unscaled, zero unscored rows and slice this process's rows by index."""
    score = _source("_generate_and_score_completions")
    for line in (
        "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)",
        "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
        "advantages = rewards - mean_grouped_rewards",
        'if self.scale_rewards != "none":',
        "advantages = torch.nan_to_num(advantages, nan=0.0)",
        "self.accelerator.process_index * len(prompts),",
        "advantages = advantages[process_slice]",
        'num_generations = self.num_generations if mode == "train" else self.num_generations_eval',
    ):
        assert line in score, f"GRPOTrainer no longer has: {line}"
