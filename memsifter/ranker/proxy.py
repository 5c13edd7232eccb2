"""The proxy ranker end to end: coarse filter -> budgeted prompt -> backend -> parser -> Ranking.

Eval and the recall endpoint call ``Proxy.rank_many``; the GRPO trainer uses the same prompt
builder and parser directly (TRL does the generation there).

When the model's ranking is partial or unparseable, ``complete_with_coarse`` (the default for
inference) appends the missing candidates in the coarse filter's order; the result says so
(``parsed.completed_from``, ``parsed.error``), and rewards never take this path: for them a
parse failure stays a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memsifter.data.types import Ranking, Session
from memsifter.ranker.backends.base import Backend, Generation, SamplingConfig
from memsifter.ranker.parse import ParsedRanking, parse_ranking
from memsifter.ranker.prompt import BuiltPrompt, PromptBuilder


@dataclass(frozen=True)
class ProxyConfig:
    window_tokens: int = 8192  # the proxy's context window
    completion_tokens: int = 1024  # reserved for <think>…</think><ranking>…</ranking>
    temperature: float = 0.0
    language: str = "en"
    complete_with_coarse: bool = True
    batch_size: int = 8  # prompts per backend call


@dataclass(frozen=True)
class ProxyRanking:
    ranking: Ranking  # every input session: the proxy's order, then the coarse filter's cut
    parsed: ParsedRanking  # positions as parsed (and completed); error kept visible
    prompt: BuiltPrompt
    generation: Generation

    @property
    def completed(self) -> bool:
        return self.parsed.completed_from is not None


@dataclass(frozen=True)
class RankRequest:
    question: str
    sessions: Sequence[Session]
    question_date: str | None = None


class Proxy:
    def __init__(self, backend: Backend, coarse, config: ProxyConfig = ProxyConfig()) -> None:
        self.backend = backend
        self.coarse = coarse
        self.config = config
        self.builder = PromptBuilder(
            backend.tokenizer,
            config.window_tokens,
            config.completion_tokens,
            coarse=coarse,
            language=config.language,
        )  # type: ignore[arg-type]
        self.name = f"memsifter[{backend.model_name}]"

    def _fallback(self, req: RankRequest, prompt: BuiltPrompt) -> tuple[int, ...]:
        if prompt.coarse_order is not None:
            return prompt.coarse_order
        # Everything fit, so the coarse filter never ranked: rank the candidates now.
        pos = {sid: i for i, sid in enumerate(prompt.candidate_ids)}
        by_id = {s.id: s for s in req.sessions}
        shown = [by_id[sid] for sid in prompt.candidate_ids]
        return tuple(pos[sid] for sid in self.coarse.score(req.question, shown).ids)

    def rank_many(self, requests: Sequence[RankRequest]) -> list[ProxyRanking]:
        prompts = [self.builder.build(r.question, r.sessions, r.question_date) for r in requests]
        sampling = SamplingConfig(
            max_new_tokens=self.config.completion_tokens, temperature=self.config.temperature
        )
        out: list[ProxyRanking] = []
        for start in range(0, len(prompts), self.config.batch_size):
            chunk = prompts[start : start + self.config.batch_size]
            gens = self.backend.generate([p.text for p in chunk], sampling)
            for req, prompt, gen in zip(requests[start:], chunk, gens, strict=False):
                out.append(self._read(req, prompt, gen[0]))
        return out

    def rank(
        self, question: str, sessions: Sequence[Session], question_date: str | None = None
    ) -> ProxyRanking:
        return self.rank_many([RankRequest(question, sessions, question_date)])[0]

    def _read(self, req: RankRequest, prompt: BuiltPrompt, gen: Generation) -> ProxyRanking:
        parsed = parse_ranking(gen.text, prompt.num_candidates)
        if self.config.complete_with_coarse and len(parsed.ids) < prompt.num_candidates:
            parsed = parsed.complete(self._fallback(req, prompt))
        ids = prompt.session_ids(parsed) + tuple(prompt.dropped_ids)
        return ProxyRanking(
            ranking=Ranking(ids=ids, source=self.name), parsed=parsed, prompt=prompt, generation=gen
        )
