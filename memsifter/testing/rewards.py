"""The reward tests' fakes and oracle: a whitespace tokenizer and a deterministic working LLM that
answers with the facts it sees, so rewards depend on the ranking without loading a model; and
``naive_rewards``, the slow reference loop the reward service must equal bit for bit."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from memsifter.data.types import Session, Turn
from memsifter.llm import Generation, SamplingParams
from memsifter.qa.answerer import Answerer
from memsifter.qa.judge import LLMJudge
from memsifter.qa.scores import task_score
from memsifter.ranker.parse import parse_ranking
from memsifter.rewards.config import RewardConfig
from memsifter.rewards.marginal_utility import marginal_utility
from memsifter.rewards.omission import answer_ranking, retrieval_ranking
from memsifter.rewards.retrieval import retrieval_reward
from memsifter.rewards.service import RewardRequest, needs_answers, render_prefix

FACTS = ["blue", "Lisbon", "violin", "nurse", "Max", "Seattle", "chess", "October", "tea", "rain"]


class WhitespaceTokenizer:
    """Whitespace tokens and a plain-text chat template: enough for Answerer.render."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[str]]:
        return {"input_ids": text.split()}

    def apply_chat_template(self, messages: list[dict], tokenize: bool = False, **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<a>"


class FakeWorkingLLM:
    """Answers with every fact it sees in its memory, plus a filler word per memory beyond two
    (so more memory is not always better), and counts every prompt it is sent."""

    name = "fake"
    model_name = "fake"

    def __init__(self) -> None:
        self._tok = WhitespaceTokenizer()
        self.seen: Counter[str] = Counter()
        self.batches: list[int] = []

    @property
    def tokenizer(self) -> WhitespaceTokenizer:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        assert sampling.greedy
        self.batches.append(len(prompts))
        out = []
        for p in prompts:
            self.seen[p] += 1
            facts = re.findall(r"fact is (\w+)", p)
            n_mem = len(re.findall(r"\[Memory \d+\]", p))
            words = facts + ["perhaps"] * max(0, n_mem - 2)
            out.append(
                [Generation(f"<answer>{' '.join(words) or 'unknown'}</answer>", 1, 1, "stop", 0.0)]
            )
        return out


def fact_sessions(n: int, tag: str = "c") -> tuple[Session, ...]:
    """``n`` dated sessions of conversation ``tag``, session i stating ``FACTS[i]``."""
    return tuple(
        Session(
            id=f"{tag}/s{i}",
            turns=(
                Turn("A", f"session {i} of {tag}: the fact is {FACTS[i % len(FACTS)]}"),
                Turn("B", "ok"),
            ),
            date_text=f"{i + 1} May 2023",
        )
        for i in range(n)
    )


def topic_sessions(n: int) -> list[Session]:
    """``n`` one-turn sessions, ``s0`` …, session i a note on topic ``i % 7``: candidates for
    the ranking head's prompt tests, where what a session says does not matter."""
    return [
        Session(
            id=f"s{i}",
            turns=(Turn("user", f"note {i} about topic {i % 7}"),),
            date_text=f"{i % 28 + 1} May 2023",
        )
        for i in range(n)
    ]


def ranking_text(ids: Sequence[int]) -> str:
    """A well-formed proxy completion ranking the candidate positions ``ids``."""
    return f"<think>hm</think><ranking>{', '.join(map(str, ids))}</ranking>"


def naive_rewards(
    requests: Sequence[RewardRequest],
    answerer: Answerer,
    config: RewardConfig | None = None,
    step: int = 0,
    judge: LLMJudge | None = None,
    total_steps: int | None = None,
) -> tuple[list[list[float]], int]:
    """The reference the service must equal bit for bit: every parsed completion scored on its
    own, with its own s_0 and one answerer call per tier, nothing shared or cached. Returns the
    rewards and the number of working-LLM calls made. Slow by design; for checks only."""
    cfg = config or RewardConfig()
    shaping = cfg.shaping if total_steps is None else cfg.shaping.for_run(total_steps)
    calls = 0
    out: list[list[float]] = []
    for req in requests:
        n = len(req.candidates)
        tiers = req.tiers(cfg.max_k_for(req.data_source))
        group: list[float] = []
        for completion in req.completions:
            parsed = parse_ranking(completion, n)
            if not parsed.ok:
                group.append(cfg.format_reward)
                continue
            r_ans = 0.0
            if needs_answers(cfg, req):
                metric = cfg.task_metric(req.data_source)
                full = answer_ranking(parsed.ids, req.question, n)
                prompts = [render_prefix(answerer, req, full[:k]) for k in (0, *tiers)]
                predictions = answerer.answer_texts(prompts)
                calls += len(prompts)
                scores = [
                    task_score(
                        p, req.answer, metric, req.category, question=req.question, judge=judge
                    )
                    for p in predictions
                ]
                r_ans = marginal_utility(
                    dict(zip((0, *tiers), scores, strict=True)), cfg.subtract_s0
                )
            gold = req.gold_positions()
            r_ret = retrieval_reward(retrieval_ranking(parsed.ids, n, gold), gold, cfg.retrieval_k)
            group.append(shaping.combine(r_ans, r_ret, step))
        out.append(group)
    return out, calls
