"""The proxy ranker end to end: coarse filter -> budgeted prompt -> backend -> parser -> Ranking.

**One front door.** ``Proxy.from_pretrained(name_or_path, backend=..., **spec overrides)`` opens a
trained proxy (or an untrained base, given its prompt) the way ``SentenceTransformer(name)``
opens an encoder: validation, ``memsifter eval proxy``, the retrieval and QA benchmarks and the
recall service all get their proxy there. The GRPO trainers use the same prompt builder and
parser directly (they generate, or score the head, themselves).

**The prompt is a** :class:`~memsifter.ranker.spec.PromptSpec`, settled by
:func:`~memsifter.ranker.checkpoint.resolve_spec`: the ``prompt_spec.json`` in the model's folder,
used as is, or for a model without one the settings the caller states explicitly. A model with
neither is refused, and so are explicit settings that contradict the model's own spec. ``Proxy``
renders with ``spec.builder(backend.tokenizer, coarse)``, the one renderer the RL data is built
with, and caps generation at ``spec.completion_tokens``.

**One generate -> parse -> rank path.** :meth:`Proxy.answer` asks the model (greedy generation,
or with ``ranking_head: first_token`` one forward pass whose ranking is written as the
completion generate would give) and parses each answer; eval and validation score that, on the
prompts their RL data holds (:class:`RenderedPrompt`). :meth:`Proxy.rank_many` renders requests,
takes the same answers and turns them into rankings of session ids.

Backends that take token ids (``accepts_token_ids``: the OpenAI HTTP backend, since vLLM's and
llama.cpp's ``/v1/completions`` accept a list of ids as ``prompt``) are sent
``BuiltPrompt.token_ids``, the ids the budget counted; the others the rendered text.

When the model's ranking is partial or unparseable, ``complete_with_coarse`` (the default for
inference) appends the missing candidates in the caller's order when the request carries one
(``RankRequest.prior``: the recall service's fused coarse + bookmark order, so a failed parse
returns exactly what coarse-only would), else in the coarse filter's order; the result says so
(``parsed.completed_from``, ``parsed.error``), and rewards never take this path: for them a
parse failure stays a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsifter.data.types import Ranking, Session
from memsifter.llm import Backend, BackendSpec, Generation, SamplingParams
from memsifter.ranker.checkpoint import PromptSettings, merge_settings, resolve_spec
from memsifter.ranker.parse import ParsedRanking
from memsifter.ranker.prompt import BuiltPrompt, PromptBuilder
from memsifter.ranker.spec import PromptSpec

if TYPE_CHECKING:
    from memsifter.coarse.base import CoarseFilter


@dataclass(frozen=True)
class ProxyParams:
    """How the proxy runs; what it is shown is its :class:`PromptSpec`."""

    temperature: float = 0.0
    complete_with_coarse: bool = True
    # Prompts per backend call. None: all in one call, for backends that batch best themselves
    # (vLLM schedules them together; transformers sorts them by length before batching).
    batch_size: int | None = 8
    # The generation cap; None: the spec's completion budget. Validation caps at the run's own.
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt rendered earlier by the spec's builder (an RL data row's ``prompt``): eval and
    validation score the very text the model was trained on, never a new rendering."""

    text: str
    num_candidates: int
    # The coarse filter's order of the candidates (positions, best first; the RL row's
    # coarse_order): what a spec with coarse_weight fuses with the head's scores.
    coarse_order: tuple[int, ...] | None = None


Prompt = BuiltPrompt | RenderedPrompt


@dataclass(frozen=True)
class ProxyAnswer:
    """The model's answer to one prompt, as it gave it."""

    generation: Generation  # the completion; the first-token head's written as generate's
    parsed: ParsedRanking  # never completed: eval and validation measure the model alone


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
    # The caller's ranking of ``sessions`` (ids, best first), if it has one: what a partial or
    # failed parse is completed from, and the order of candidates the prompt could not hold.
    prior: Sequence[str] | None = None


class Proxy:
    """``spec`` decides the prompt (see the module doc); ``coarse`` defaults to
    ``build_filter(spec.coarse)`` (the recall service passes a thread-safe one). Open a model
    with :meth:`from_pretrained`; the constructor takes a backend and a spec already settled."""

    def __init__(
        self,
        backend: Backend,
        spec: PromptSpec,
        coarse: CoarseFilter | None = None,
        config: ProxyParams = ProxyParams(),
    ) -> None:
        if not isinstance(spec, PromptSpec):
            raise TypeError(
                "Proxy(backend, spec, coarse=None, config=ProxyParams()): spec must be a "
                f"PromptSpec (see Proxy.from_pretrained), got {type(spec).__name__}"
            )
        if spec.ranking_head == "first_token":
            from memsifter.ranker.first_token import check_backend, check_label_capacity

            # the head needs the logits: refused now, not per request
            check_backend(backend, spec.head_read)
            if spec.head_read == "marker":
                from memsifter.ranker.first_token import marker_token_id

                marker_token_id(backend.tokenizer)  # the read token must be one token
            else:
                # A tokenizer that cannot write the spec's labels at all, too: now, by name.
                check_label_capacity(backend.tokenizer, 1, spec.labels)
        self.backend = backend
        self.spec = spec
        self.config = config
        self._coarse = coarse
        self.name = f"memsifter[{backend.model_name}]"

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        backend: Backend | BackendSpec | str = "transformers",
        coarse: CoarseFilter | None = None,
        params: ProxyParams = ProxyParams(),
        prompt: PromptSettings = None,
        spec: str | None = None,
        hint: str = "prompt settings, or keyword arguments of Proxy.from_pretrained",
        **spec_overrides: Any,
    ) -> Proxy:
        """The proxy ``name_or_path`` names (a trained checkpoint or adapter folder, the shipped
        proxy, an untrained base or hub id), shown the prompt it was trained on.

        The spec is the model's own ``prompt_spec.json``; ``prompt`` (settings, a spec, or a
        spec file) and ``spec_overrides`` (PromptSpec fields, ``budget_tokens``) may repeat it
        but not contradict it, and are the spec of a model that has none (see
        :func:`~memsifter.ranker.checkpoint.resolve_spec`). It is settled before the model
        loads, so a refusal costs nothing. ``backend``: a kind (``transformers``, ``vllm``) run
        on ``name_or_path``, a :class:`~memsifter.llm.BackendSpec`, or a backend already built.
        ``spec="official"`` (or ``prompt="official"``): the released MemSifter proxy's own prompt
        and parse rules (:mod:`memsifter.ranker.official`), e.g.
        ``Proxy.from_pretrained("zstanjj/MemSifter-4B-Thinking", spec="official")``.
        """
        given = merge_settings(("prompt", prompt), ("spec", spec), ("arguments", spec_overrides))
        spec = resolve_spec(name_or_path, given, hint=hint)
        if not isinstance(backend, str | BackendSpec):
            return cls(backend, spec, coarse, params)
        from memsifter import llm  # the module, so a test may stand in for build_backend

        if isinstance(backend, str):
            backend = BackendSpec(kind=backend, model=str(name_or_path))
        return cls(llm.build_backend(backend), spec, coarse, params)

    @cached_property
    def builder(self) -> PromptBuilder:
        # Made on first use: eval and validation score prompts rendered when the data was built,
        # so they need no renderer (nor the coarse filter it builds, a model for a dense one).
        return self.spec.builder(self.backend.tokenizer, self._coarse)

    @property
    def coarse(self) -> CoarseFilter:
        return self.builder.coarse  # type: ignore[return-value]

    def close(self) -> None:
        """Release the backend (an in-process vLLM engine holds most of its GPU until then)."""
        close: Callable[[], None] | None = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def _fallback(self, req: RankRequest, prompt: BuiltPrompt) -> tuple[int, ...]:
        if req.prior is not None:
            # The caller ranked the candidates already (with evidence the coarse filter lacks,
            # such as bookmarks): complete from that, not from a re-score.
            return _prior_positions(req.prior, prompt.candidate_ids)
        if prompt.coarse_order is not None:
            # The coarse ranking the builder made; with spec.order == "coarse" it is the shown
            # order itself, so completion never re-scores what the prompt already ranked.
            return prompt.coarse_order
        if prompt.num_candidates == 1:  # a lone (maybe truncated) candidate: nothing to rank
            return (0,)
        # Everything fit, so the coarse filter never ranked: rank the candidates now.
        pos = {sid: i for i, sid in enumerate(prompt.candidate_ids)}
        by_id = {s.id: s for s in req.sessions}
        shown = [by_id[sid] for sid in prompt.candidate_ids]
        return tuple(pos[sid] for sid in self.coarse.score(req.question, shown).ids)

    def _payload(self, prompt: Prompt) -> Any:
        """What the backend is sent: the prompt's token ids when it takes ids (the ids counted
        are the ids the model sees, and the server skips tokenizing), else the rendered text."""
        ids = prompt.token_ids if isinstance(prompt, BuiltPrompt) else None
        if ids is not None and getattr(self.backend, "accepts_token_ids", False):
            return list(ids)
        return prompt.text

    def answer(
        self,
        prompts: Sequence[Prompt],
        progress: Callable[[int, float], None] | None = None,
        coarse_orders: Sequence[Sequence[int] | None] | None = None,
    ) -> list[ProxyAnswer]:
        """The one generate -> parse path: the model's answer to each prompt, read by the
        parser, ``batch_size`` prompts a backend call. ``progress(n, seconds)`` hears of each
        call: how many prompts it answered and its wall time. ``coarse_orders`` (one a prompt)
        replace the prompts' own for a spec with ``coarse_weight``
        (:mod:`memsifter.ranker.coarse_prior`)."""
        size = self.config.batch_size or max(len(prompts), 1)
        if coarse_orders is None:
            coarse_orders = [p.coarse_order for p in prompts]
        out: list[ProxyAnswer] = []
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            t0 = time.perf_counter()
            if self.spec.ranking_head == "first_token":
                gens = self._head(chunk, coarse_orders[start : start + size])
            else:
                gens = self._generate(chunk)
            out += [
                ProxyAnswer(g, self.spec.parse(g.text, p.num_candidates))
                for p, g in zip(chunk, gens, strict=True)
            ]
            if progress is not None:
                progress(len(chunk), time.perf_counter() - t0)
        return out

    def _generate(self, prompts: Sequence[Prompt]) -> list[Generation]:
        cap = self.config.max_new_tokens
        sampling = SamplingParams(
            max_new_tokens=self.spec.completion_tokens if cap is None else cap,
            temperature=self.config.temperature,
        )
        gens = self.backend.generate([self._payload(p) for p in prompts], sampling)
        return [g[0] for g in gens]

    def _head(
        self, prompts: Sequence[Prompt], coarse_orders: Sequence[Sequence[int] | None]
    ) -> list[Generation]:
        """One forward pass a prompt; the ranking is written as the completion ``generate``
        would produce, so it is read (and completed, and mapped to ids) the same way. The
        scores are fused with the coarse prior first when the spec says so."""
        from memsifter.ranker.coarse_prior import fuse
        from memsifter.ranker.first_token import backend_scores, order_scores, ranking_text

        t0 = time.perf_counter()
        scores = backend_scores(
            self.backend,
            [p.text for p in prompts],
            [p.num_candidates for p in prompts],
            self.config.batch_size or len(prompts),
            # A prompt rendered earlier is only text: a server is sent the ids the tokenizer
            # makes of it (backend_rankings' default), as the data's builder counted them.
            payloads=[self._payload(p) for p in prompts]
            if all(isinstance(p, BuiltPrompt) for p in prompts)
            else None,
            labels=self.spec.labels,
            read=self.spec.head_read,
        )
        weight = self.spec.coarse_weight
        orders = [
            order_scores(fuse(s, c, weight)) for s, c in zip(scores, coarse_orders, strict=True)
        ]
        latency = time.perf_counter() - t0
        return [
            Generation(
                text=ranking_text(order),
                prompt_tokens=p.n_tokens if isinstance(p, BuiltPrompt) else 0,
                completion_tokens=0,
                finish_reason="stop",
                latency_s=latency,
            )
            for p, order in zip(prompts, orders, strict=True)
        ]

    def rank_many(self, requests: Sequence[RankRequest]) -> list[ProxyRanking]:
        prompts = [self.builder.build(r.question, r.sessions, r.question_date) for r in requests]
        # The caller's ranking, where it gives one, is the coarse opinion a fused head reads
        # (the service's coarse + bookmark order); else the builder's coarse ranking.
        orders = [
            _prior_positions(r.prior, p.candidate_ids) if r.prior is not None else p.coarse_order
            for r, p in zip(requests, prompts, strict=True)
        ]
        answers = self.answer(prompts, coarse_orders=orders)
        return [self._rank(r, p, a) for r, p, a in zip(requests, prompts, answers, strict=True)]

    def rank(
        self,
        question: str,
        sessions: Sequence[Session],
        question_date: str | None = None,
        *,
        prior: Sequence[str] | None = None,
    ) -> ProxyRanking:
        """``prior``: see :attr:`RankRequest.prior`."""
        return self.rank_many([RankRequest(question, sessions, question_date, prior)])[0]

    def _rank(self, req: RankRequest, prompt: BuiltPrompt, answer: ProxyAnswer) -> ProxyRanking:
        parsed = answer.parsed
        if self.config.complete_with_coarse and len(parsed.ids) < prompt.num_candidates:
            parsed = parsed.complete(self._fallback(req, prompt))
        dropped = tuple(prompt.dropped_ids)
        if req.prior is not None and dropped:
            dropped = tuple(dropped[i] for i in _prior_positions(req.prior, dropped))
        ids = prompt.session_ids(parsed) + dropped
        return ProxyRanking(
            ranking=Ranking(ids=ids, source=self.name),
            parsed=parsed,
            prompt=prompt,
            generation=answer.generation,
        )


def _prior_positions(prior: Sequence[str], ids: Sequence[str]) -> tuple[int, ...]:
    """Positions of ``ids`` in ``prior``'s order; ids ``prior`` lacks follow in their own order."""
    rank = {sid: i for i, sid in enumerate(prior)}
    end = len(rank)
    return tuple(sorted(range(len(ids)), key=lambda i: (rank.get(ids[i], end), i)))
