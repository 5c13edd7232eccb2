"""Outcome-driven rewards for the proxy: how much its ranking helps the working LLM answer.

The paper's definitions, one module each: Fibonacci tiers and their weights (``tiers``), the
answer reward R_ans (``marginal_utility``), the retrieval reward R_ret (``retrieval``), warm-up
shaping (``shaping``) and how a short ranking is scored (``omission``). ``service`` computes them
for GRPO groups with as few working-LLM calls as exactness allows, ``trl`` wraps it as a TRL
reward function, ``columns`` is the dataset-column contract between the two, and ``config`` the
typed configuration.
"""

from memsifter.rewards.columns import (
    REWARD_COLUMNS,
    reward_columns,
    sessions_from_column,
    sessions_to_column,
)
from memsifter.rewards.config import (
    AnswererSettings,
    JudgeSettings,
    RetrySettings,
    RewardConfig,
    load_reward_config,
)
from memsifter.rewards.marginal_utility import marginal_utility
from memsifter.rewards.omission import answer_ranking, omission_order, retrieval_ranking
from memsifter.rewards.retrieval import retrieval_reward, retrieval_rewards
from memsifter.rewards.service import (
    CompletionReward,
    RewardBatch,
    RewardError,
    RewardRequest,
    RewardService,
    RewardStats,
    TierRepeatWarning,
)
from memsifter.rewards.shaping import ShapingSchedule
from memsifter.rewards.tiers import (
    TIER_WEIGHTS,
    fibonacci_tiers,
    position_value,
    repeat_credit,
    tier_weights,
)
from memsifter.rewards.trl import RewardFunction, make_reward_function

__all__ = [
    "REWARD_COLUMNS",
    "AnswererSettings",
    "CompletionReward",
    "JudgeSettings",
    "RetrySettings",
    "RewardBatch",
    "RewardConfig",
    "RewardError",
    "RewardFunction",
    "RewardRequest",
    "RewardService",
    "RewardStats",
    "ShapingSchedule",
    "TierRepeatWarning",
    "fibonacci_tiers",
    "load_reward_config",
    "make_reward_function",
    "answer_ranking",
    "marginal_utility",
    "omission_order",
    "position_value",
    "retrieval_ranking",
    "retrieval_reward",
    "retrieval_rewards",
    "reward_columns",
    "sessions_from_column",
    "sessions_to_column",
    "repeat_credit",
    "tier_weights",
    "TIER_WEIGHTS",
]
