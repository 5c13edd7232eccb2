"""The reward service: calls counted against a fake working LLM (s_0 once per prompt, shared
prefixes share one call, never more than naive), rewards equal to the naive loop bit for bit,
format failures, the judge score, config refusals, and a failing endpoint that raises after its
retries instead of handing out a reward."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from memsifter.errors import DataError
from memsifter.llm import BackendError, Generation, SamplingParams
from memsifter.llm.openai_http import OpenAIBackend
from memsifter.qa.answerer import Answerer
from memsifter.qa.judge import JudgeError, LLMJudge
from memsifter.rewards import (
    AnswererSettings,
    RetrySettings,
    RewardConfig,
    RewardError,
    RewardRequest,
    RewardService,
    TierRepeatWarning,
    answer_ranking,
    load_reward_config,
)
from memsifter.testing.rewards import (
    FakeWorkingLLM,
    WhitespaceTokenizer,
    fact_sessions,
    naive_rewards,
    ranking_text,
)

ROOT = Path(__file__).resolve().parents[2]


def _answerer(
    cfg: RewardConfig | None = None, window: int = 100_000, backend: Any = None
) -> Answerer:
    order = (cfg or RewardConfig()).answerer.memory_order
    return Answerer(backend or FakeWorkingLLM(), window, 8, memory_order=order)


def _service(cfg: RewardConfig | None = None, window: int = 100_000) -> RewardService:
    return RewardService(_answerer(cfg, window), cfg)


def _request(completions: Sequence[str], n: int = 8, tag: str = "c", **kw: Any) -> RewardRequest:
    fields: dict[str, Any] = dict(
        question=f"What is the fact of {tag}?",
        answer="blue Lisbon",
        candidates=fact_sessions(n, tag),
        gold_ids=(f"{tag}/s0", f"{tag}/s1"),
        question_date="9 May 2023",
        data_source="custom",
    )
    fields.update(kw)
    return RewardRequest(completions=tuple(completions), **fields)


def test_calls_s0_once_and_shared_prefixes() -> None:
    rankings = [
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 1, 2, 3, 4, 5, 6, 7],  # identical: shares everything
        [0, 1, 2, 3, 4, 7, 6, 5],  # same top-5, differs at top-8
        [0, 2, 1, 3, 4, 5, 6, 7],  # same top-1 only
        [1, 0],  # short ranking: top-3/5/8 are all its top-2
    ]
    completions = [ranking_text(r) for r in rankings] + ["I do not know"]
    service = _service(RewardConfig(answerer=AnswererSettings(memory_order="rank")))
    batch = service.score([_request(completions)])
    backend = service.answerer.backend
    tiers = (1, 2, 3, 5, 8)
    question = "What is the fact of c?"
    shown = [answer_ranking(r, question, 8) for r in rankings]  # the short one is completed
    prefixes = {tuple(r[:k]) for r in shown for k in tiers}
    s = batch.stats
    assert s.completions == 6 and s.parsed == 5
    assert s.naive_calls == 5 * (len(tiers) + 1)
    assert s.prompt_refs == 1 + 5 * len(tiers)
    assert s.answer_calls == s.unique_prompts == len(prefixes) + 1  # + s_0
    assert s.answer_calls <= s.naive_calls
    assert backend.batches == [s.answer_calls]  # one batch for the whole call
    assert max(backend.seen.values()) == 1  # no prompt was sent twice
    assert sum("(no memory)" in p for p in backend.seen) == 1  # s_0 once per prompt
    # The unparseable completion costs nothing and gets the format reward.
    last = batch.rewards[0][-1]
    assert not last.parsed and last.reward == -1.0 and last.error == "missing_ranking"
    # Identical completions, identical rewards; the short ranking keeps its own ids in the
    # record but is shown completed, so its top-8 is not its top-2.
    r = batch.rewards[0]
    assert r[0] == r[1]
    assert r[4].ranking == (1, 0) and r[4].omitted == 6
    assert r[4].tier_scores[8] != r[4].tier_scores[2]

    # Asked again (a later epoch), everything comes from the cache.
    again = service.score([_request(completions)])
    assert again.stats.answer_calls == 0 and again.stats.cache_hits == s.unique_prompts
    assert again.flat() == batch.flat()
    assert service.totals.answer_calls == s.answer_calls


def test_chronological_memory_shares_top_k_sets() -> None:
    rankings = [[0, 1, 2], [1, 0, 2], [2, 1, 0]]
    completions = [ranking_text(r) for r in rankings]
    rank = RewardConfig(answerer=AnswererSettings(memory_order="rank"))
    by_rank = _service(rank).score([_request(completions, n=3)]).stats
    cfg = RewardConfig(answerer=AnswererSettings(memory_order="chronological"))
    service = _service(cfg)
    by_set = service.score([_request(completions, n=3)]).stats
    # rank: s_0, top-1 x3, top-2 x3 ({0,1} twice, but in two orders), top-3 x3 -> 10 prompts;
    # chronological: s_0, {0}, {1}, {2}, {0,1}, {1,2}, {0,1,2} -> 7.
    assert (by_rank.answer_calls, by_set.answer_calls) == (10, 7)
    both = [p for p in service.answerer.backend.seen if "is blue" in p and "is Lisbon" in p]
    assert len(both) == 2 and all(p.index("is blue") < p.index("is Lisbon") for p in both)


def test_chronological_window_drops_lowest_ranked_not_newest() -> None:
    """Chronological display must not change which sessions fit: the lowest-ranked go."""
    sessions = fact_sessions(8)
    ranked = [sessions[i] for i in (7, 0, 3, 5)]  # newest session ranked first
    chrono = _answerer(window=10_000)
    full = chrono.render("q", ranked, None, times=[7, 0, 3, 5])
    ids = [s.id for s in sessions]
    order = [ids.index(i) for i in _memory_ids(full)]
    assert order == [0, 3, 5, 7]
    cut = _answerer(window=chrono._count(full) + 8 - 1)  # one token short of all four
    shown = [ids.index(i) for i in _memory_ids(cut.render("q", ranked, None, times=[7, 0, 3, 5]))]
    assert shown == [0, 3, 7]  # session 5 (ranked last) is dropped, the newest (7) kept
    with pytest.raises(ValueError, match="time key"):
        chrono.render("q", ranked, None)
    with pytest.raises(ValueError, match="memory_order"):
        RewardService(
            _answerer(RewardConfig(answerer=AnswererSettings(memory_order="rank"))), RewardConfig()
        )


def _memory_ids(prompt: str) -> list[str]:
    shown = [s for s in fact_sessions(8) if s.render() in prompt]
    return [s.id for s in sorted(shown, key=lambda s: prompt.index(s.render()))]


def test_same_question_twice_in_a_batch_shares_s0() -> None:
    service = _service()
    req = _request([ranking_text([0, 1, 2])], n=3)
    batch = service.score([req, req])
    assert batch.stats.naive_calls == 2 * 4
    assert batch.stats.answer_calls == 4  # s_0, top-1, top-2, top-3, once
    assert batch.rewards[0] == batch.rewards[1]


def test_window_cut_prompts_are_shared_by_hash() -> None:
    """Top-5 and top-8 cut to the same sessions by the answerer's window send one prompt."""
    service = _service(window=120)
    with pytest.warns(TierRepeatWarning, match="full at tier 3"):
        batch = service.score([_request([ranking_text(range(8))])])
    assert batch.stats.window_full_k == {"custom": 3}
    rendered = {
        k: service.answerer.render("q", fact_sessions(k), None, times=list(range(k)))
        for k in (3, 5, 8)
    }
    assert rendered[5] == rendered[8]
    assert batch.stats.answer_calls < batch.stats.prompt_refs


def _random_batch(rng: random.Random, n_groups: int) -> list[RewardRequest]:
    requests = []
    for g in range(n_groups):
        n = rng.randint(1, 12)
        comps = []
        for _ in range(rng.randint(1, 8)):
            roll = rng.random()
            if roll < 0.15:
                comps.append(
                    rng.choice(["garbage", "<ranking></ranking>", "<ranking>99</ranking>"])
                )
            elif roll < 0.3 and comps:
                comps.append(rng.choice(comps))  # GRPO samples repeat
            else:
                ids = rng.sample(range(n), rng.randint(1, n))
                if rng.random() < 0.2:
                    ids = ids + [ids[0], n + 3]  # duplicates and out-of-range ids are dropped
                comps.append(ranking_text(ids))
        gold_ids = tuple(f"g{g % 3}/s{i}" for i in rng.sample(range(12), rng.randint(0, 3)))
        source = rng.choice(["custom", "locomo", "exact"])
        category = rng.choice(["1", "2", "3", "4", "5", None])
        if source == "locomo" and category is None:
            category = "4"  # LoCoMo's score refuses a row without a category, as LoCoMo does
        requests.append(
            _request(
                comps,
                n=n,
                tag=f"g{g % 3}",
                gold_ids=gold_ids,
                data_source=source,
                category=category,
            )
        )
    return requests


@pytest.mark.parametrize("seed", range(12))
def test_service_equals_naive_loop_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    cfg = RewardConfig(
        max_k=rng.choice([1, 3, 8, 13]),
        beta0=0.7,
        decay_steps=10,
        schedule=rng.choice(["linear", "cosine"]),
        format_reward=-1.25,
        task_metrics={"locomo": "locomo", "exact": "em"},
        answerer=AnswererSettings(memory_order=rng.choice(["rank", "chronological"])),
    )
    requests = _random_batch(rng, rng.randint(1, 5))
    step = rng.choice([0, 3, 10, 20])
    service = _service(cfg)
    batch = service.score(requests, step=step)
    fake = FakeWorkingLLM()
    expected, naive_calls = naive_rewards(requests, _answerer(cfg, backend=fake), cfg, step)
    assert [[c.reward for c in g] for g in batch.rewards] == expected  # exact float equality
    assert batch.stats.naive_calls == naive_calls == sum(fake.seen.values())
    assert batch.stats.answer_calls <= naive_calls
    assert batch.stats.completions - batch.stats.parsed == sum(
        c == -1.25 for g in expected for c in g
    )


def test_format_reward_is_configurable_and_counted() -> None:
    service = _service(RewardConfig(format_reward=-1.0))
    batch = service.score([_request(["nope", "<ranking>", "<ranking>x, y</ranking>"])])
    assert [c.reward for c in batch.rewards[0]] == [-1.0, -1.0, -1.0]
    assert [c.error for c in batch.rewards[0]] == [
        "missing_ranking",
        "unclosed_ranking",
        "no_valid_ids",
    ]
    assert batch.stats.parsed == 0 and batch.stats.completions == 3
    assert batch.stats.answer_calls == 0  # not even s_0 when nothing parsed
    assert batch.stats.parse_rate == 0.0


def test_reward_components() -> None:
    cfg = RewardConfig(alpha=2.0, beta0=0.5, decay_steps=100, format_reward=-2.0)
    batch = _service(cfg).score([_request([ranking_text([0, 1, 2])], n=3)], step=0)
    c = batch.rewards[0][0]
    assert c.tier_scores[0] == 0.0  # no memory, no facts
    assert c.r_ret == 1.0  # both gold sessions first
    assert c.reward == 2.0 * c.r_ans + 0.5 * c.r_ret
    assert batch.stats.beta == 0.5


# -- judge --------------------------------------------------------------------------------------


class FakeJudgeBackend:
    name = "judge"
    model_name = "judge"

    def __init__(self, reply: str | None = None) -> None:
        self._tok = WhitespaceTokenizer()
        self.prompts: list[str] = []
        self.reply = reply

    @property
    def tokenizer(self) -> WhitespaceTokenizer:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        assert sampling.greedy
        self.prompts += prompts
        out = []
        for p in prompts:
            text = self.reply or ("Yes." if "Response: blue" in p else "no")
            out.append([Generation(text, 1, 1, "stop", 0.0)])
        return out


def test_judge_metric_through_the_service() -> None:
    cfg = RewardConfig(
        task_metrics={"lme": "judge"}, answerer=AnswererSettings(memory_order="rank")
    )
    judge = LLMJudge(FakeJudgeBackend())
    service = RewardService(_answerer(cfg), cfg, judge)
    req = _request(
        [ranking_text([0, 1]), ranking_text([1, 0]), ranking_text([0, 1])], n=2, data_source="lme"
    )
    batch = service.score([req])
    # Answers: s_0 "unknown"; top-1 "blue" or "Lisbon"; top-2 "blue Lisbon"/"Lisbon blue".
    assert batch.stats.judge_calls == len(judge.backend.prompts) == 5
    assert batch.rewards[0][0].tier_scores == {0: 0.0, 1: 1.0, 2: 1.0}
    assert batch.rewards[0][1].tier_scores == {0: 0.0, 1: 0.0, 2: 0.0}
    expected, _ = naive_rewards([req], _answerer(cfg), cfg, 0, judge)
    assert [[c.reward for c in g] for g in batch.rewards] == expected
    assert service.score([req]).stats.judge_calls == 0  # verdicts are cached


def test_judge_garbage_raises_and_missing_judge_raises() -> None:
    cfg = RewardConfig(task_metrics={"lme": "judge"})
    req = _request([ranking_text([0])], n=1, data_source="lme")
    bad = RewardService(_answerer(cfg), cfg, LLMJudge(FakeJudgeBackend("maybe")))
    with pytest.raises(JudgeError, match="maybe"):
        bad.score([req])
    with pytest.raises(RewardError, match="no judge"):
        _service(cfg).score([req])


# -- config -------------------------------------------------------------------------------------


def test_default_config_loads() -> None:
    cfg = load_reward_config(ROOT / "configs/rewards/default.yaml")
    assert cfg == RewardConfig()
    assert cfg.task_metric("locomo") == "locomo" and cfg.task_metric("other") == "f1"


def test_config_refuses_sampling_answerer(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("answerer:\n  temperature: 0.7\n")
    with pytest.raises(DataError, match="greedy") as err:
        load_reward_config(path)
    assert str(path) in str(err.value)
    path.write_text("answerer:\n  temprature: 0.0\n")
    with pytest.raises(DataError, match="unknown key"):
        load_reward_config(path)
    path.write_text("task_metrics: {locomo: bleu}\n")
    with pytest.raises(DataError, match="bleu"):
        load_reward_config(path)
    with pytest.raises(DataError, match="no task metric"):
        RewardConfig(default_task_metric=None).task_metric("unknown")


# -- failures -----------------------------------------------------------------------------------


def _openai_answerer(handler: Any, tokenizer_dir: Path) -> Answerer:
    backend = OpenAIBackend(
        "http://answerer:1",
        model="m",
        tokenizer=str(tokenizer_dir),
        max_retries=2,
        retry_wait_s=0.0,
        transport=httpx.MockTransport(handler),
    )
    return _answerer(window=4096, backend=backend)


def _completion(text: str) -> httpx.Response:
    return httpx.Response(200, json={"choices": [{"index": 0, "text": text}], "usage": {}})


def test_failing_endpoint_raises_after_retries(tiny_qwen3: Path) -> None:
    requests: Counter[str] = Counter()

    def handler(request: httpx.Request) -> httpx.Response:
        prompt = json.loads(request.content)["prompt"]
        requests["s0" if "(no memory)" in prompt else "tier"] += 1
        if "(no memory)" in prompt:
            return _completion("<answer>unknown</answer>")
        return httpx.Response(503, text="overloaded")

    cfg = RewardConfig(retry=RetrySettings(attempts=2, wait_s=0.0))
    service = RewardService(_openai_answerer(handler, tiny_qwen3), cfg)
    with pytest.raises(RewardError, match="after 2 attempt") as err:
        service.score([_request([ranking_text([0])], n=1)])
    assert isinstance(err.value.__cause__, BackendError)
    # Each service attempt is one backend call, which tries the request 1 + max_retries times.
    assert requests["tier"] == 2 * 3
    assert service.totals.completions == 0  # nothing was scored


def test_transient_failure_then_success(tiny_qwen3: Path) -> None:
    state = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        state["n"] += 1
        if state["n"] <= 4:  # more failures than one backend call retries
            return httpx.Response(502, text="bad gateway")
        prompt = json.loads(request.content)["prompt"]
        return _completion("<answer>blue</answer>" if "blue" in prompt else "<answer>?</answer>")

    cfg = RewardConfig(retry=RetrySettings(attempts=3, wait_s=0.0))
    service = RewardService(_openai_answerer(handler, tiny_qwen3), cfg)
    batch = service.score([_request([ranking_text([0])], n=1)])
    assert batch.rewards[0][0].tier_scores == {0: 0.0, 1: pytest.approx(2 / 3)}


def test_from_config_builds_http_answerer_and_judge() -> None:
    from memsifter.rewards import JudgeSettings

    cfg = RewardConfig(
        answerer=AnswererSettings(
            model="m", backend="openai", base_url="http://a:1", max_concurrency=3
        ),
        judge=JudgeSettings(model="j", base_url="http://j:2/v1", max_new_tokens=4),
    )
    service = RewardService.from_config(cfg)
    assert isinstance(service.answerer.backend, OpenAIBackend)
    assert service.answerer.backend.max_concurrency == 3
    assert service.answerer.window_tokens == cfg.answerer.window_tokens
    assert service.judge is not None and service.judge.max_new_tokens == 4
    assert service.judge.backend.base_url == "http://j:2/v1"


def test_client_error_is_not_retried(tiny_qwen3: Path) -> None:
    hits = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        hits["n"] += 1
        return httpx.Response(404, text="model not found")

    cfg = RewardConfig(retry=RetrySettings(attempts=3, wait_s=0.0))
    service = RewardService(_openai_answerer(handler, tiny_qwen3), cfg)
    with pytest.raises(RewardError, match="after 1 attempt"):
        service.score([_request([ranking_text([0])], n=1)])
    assert 1 <= hits["n"] <= 2  # s_0 and top-1 at most once each: no retries
