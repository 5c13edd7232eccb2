"""The reward service against a real working LLM (SmolLM2-135M-Instruct through transformers):
rewards equal to the naive loop bit for bit, in fewer calls."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from memsifter.data import load_locomo
from memsifter.llm import BackendSpec, build_backend
from memsifter.qa.answerer import Answerer
from memsifter.rewards import RewardConfig, RewardRequest, RewardService
from memsifter.testing.rewards import naive_rewards


@pytest.mark.slow
def test_service_matches_naive_with_smollm2(smollm2_dir: Path, locomo_mini_path: Path) -> None:
    # Batch size 1: with left-padded batches an answer can depend (at a near tie) on the batch it
    # was generated in, and the two paths batch differently; see memsifter.rewards.service.
    backend = build_backend(
        BackendSpec(kind="transformers", model=str(smollm2_dir), batch_size=1, threads=2)
    )
    cfg = RewardConfig(max_k=3, beta0=0.5, decay_steps=10)
    answerer = Answerer(backend, 512, 12, memory_order=cfg.answerer.memory_order)
    rng = random.Random(0)
    queries = [q for q in load_locomo(locomo_mini_path).queries if q.has_evidence][:2]
    requests = []
    for q in queries:
        candidates = q.haystack[:4]
        rankings = [rng.sample(range(len(candidates)), len(candidates)) for _ in range(2)]
        rankings.append(rankings[0])  # a repeated sample, as GRPO groups have
        requests.append(
            RewardRequest(
                question=q.question,
                answer=str(q.answer),
                candidates=tuple(candidates),
                completions=tuple(f"<ranking>{', '.join(map(str, r))}</ranking>" for r in rankings),
                gold_ids=q.gold_session_ids,
                question_date=q.question_date,
                category=q.category,
                data_source="locomo",
            )
        )
    batch = RewardService(answerer, cfg).score(requests, step=2)
    expected, naive_calls = naive_rewards(requests, answerer, cfg, step=2)
    assert [[c.reward for c in g] for g in batch.rewards] == expected
    assert batch.stats.naive_calls == naive_calls == 2 * 3 * 4
    # Memory reaches the prompts (s_0 and several tier prompts per question), and still fewer
    # calls than naive.
    assert 2 * 3 <= batch.stats.answer_calls < naive_calls
