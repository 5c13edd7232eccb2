"""The proxy ranker end to end: coarse filter -> budgeted prompt -> backend -> parser -> Ranking.

Eval and the recall endpoint call ``Proxy.rank_many``; the GRPO trainer uses the same prompt
builder and parser directly (TRL does the generation there).

**The prompt is a** :class:`~memsifter.ranker.spec.PromptSpec`. ``Proxy`` renders with
``spec.builder(backend.tokenizer, coarse)``, the one renderer the RL data is built with, and caps
generation at ``spec.completion_tokens``. :func:`resolve_spec` is how every caller (eval, the
recall service) gets that spec: the ``prompt_spec.json`` in the model's folder, used as is, or
for a model without one (an untrained base) the settings the caller states explicitly. A model
with neither is refused, and so are explicit settings that contradict the model's own spec.

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

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsifter.data.types import Ranking, Session
from memsifter.errors import MemSifterError
from memsifter.llm import Backend, Generation, SamplingParams
from memsifter.ranker.parse import ParsedRanking, parse_ranking
from memsifter.ranker.prompt import BuiltPrompt
from memsifter.ranker.spec import SPEC_FILE, PromptSpec

_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(PromptSpec))
# Settable besides the spec's own fields: the prompt budget, window - completion (the
# ``--coarse-budget`` of eval), checked against the spec like any field.
PROMPT_KEYS = (*_SPEC_FIELDS, "budget_tokens")


class PromptSpecError(MemSifterError, ValueError):
    """No prompt spec for a model, or explicit prompt settings that contradict its own."""


PromptSettings = Mapping[str, Any] | PromptSpec | str | Path | None


def _as_settings(given: PromptSettings, where: str) -> dict[str, Any]:
    """Explicit prompt settings as a mapping of the keys actually given. A string or path is a
    ``prompt_spec.json`` file or a folder holding one (an RL data folder, a checkpoint)."""
    if given is None:
        return {}
    if isinstance(given, PromptSpec):
        return given.to_dict()
    if isinstance(given, str | Path):
        path = Path(given).expanduser()
        if path.is_dir():
            path = path / SPEC_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PromptSpecError(f"{where}: cannot read the prompt spec {path}: {e}") from e
        if not isinstance(data, dict):
            raise PromptSpecError(f"{where}: {path} must hold an object")
        return _as_settings(data, str(path))
    settings = {k: v for k, v in dict(given).items() if v is not None}
    unknown = sorted(set(settings) - set(PROMPT_KEYS))
    if unknown:
        raise PromptSpecError(
            f"{where}: unknown prompt setting(s) {unknown}; valid: {', '.join(PROMPT_KEYS)}"
        )
    return settings


def _value(spec: PromptSpec, key: str) -> Any:
    return spec.budget_tokens if key == "budget_tokens" else getattr(spec, key)


def _differences(spec: PromptSpec, settings: Mapping[str, Any]) -> list[str]:
    # ``model`` only names whose tokenizer renders; a checkpoint's folder is a different name for
    # the same tokenizer, so it is not compared.
    return [
        f"{k}: {v!r} (the model's spec: {_value(spec, k)!r})"
        for k, v in settings.items()
        if k != "model" and _value(spec, k) != v
    ]


def merge_settings(*sources: tuple[str, PromptSettings]) -> dict[str, Any]:
    """Explicit settings from several places (a ``prompt:`` block, legacy flags), merged; the
    same key given twice with different values is refused, naming both places."""
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    clashes = []
    for where, given in sources:
        for k, v in _as_settings(given, where).items():
            if k in merged and merged[k] != v:
                clashes.append(f"{k}: {merged[k]!r} ({origin[k]}) vs {v!r} ({where})")
            merged.setdefault(k, v)
            origin.setdefault(k, where)
    if clashes:
        raise PromptSpecError("conflicting prompt settings: " + "; ".join(clashes))
    return merged


def resolve_spec(
    model: str,
    given: PromptSettings = None,
    *,
    hint: str = "a `prompt:` block in the config",
) -> PromptSpec:
    """The prompt ``model`` is to be shown.

    * Its folder has ``prompt_spec.json`` (a trained checkpoint, an adapter, the shipped proxy):
      that spec, as is. ``given`` may repeat its values but not contradict them: a difference is
      an error listing every differing field.
    * It has none (an untrained base, a hub id): ``given`` is the spec; fields it leaves out take
      :class:`PromptSpec`'s defaults, ``budget_tokens`` sets the window as budget + completion.
      No ``given`` either: refused, naming the model; ``hint`` says where to give one.
    """
    from memsifter.models import model_spec

    settings = _as_settings(given, "prompt")
    own = model_spec(model)
    if own is not None:
        diff = _differences(own, settings)
        if diff:
            raise PromptSpecError(
                f"model {model!r} carries its own {SPEC_FILE}, and the explicit prompt settings "
                f"contradict it: {'; '.join(diff)}. Drop them (the model is served the prompt it "
                "was trained on) or change them to match"
            )
        return own
    if not settings:
        raise PromptSpecError(
            f"model {model!r} has no {SPEC_FILE} (an untrained model?), so nothing says which "
            f"prompt to show it: give a prompt spec explicitly ({hint})"
        )
    fields = {k: v for k, v in settings.items() if k != "budget_tokens"}
    fields.setdefault("model", model)
    if "budget_tokens" in settings:
        completion = fields.get("completion_tokens", PromptSpec.completion_tokens)
        window = settings["budget_tokens"] + completion
        if "window_tokens" in fields and fields["window_tokens"] != window:
            raise PromptSpecError(
                f"prompt budget_tokens {settings['budget_tokens']} + completion_tokens "
                f"{completion} != window_tokens {fields['window_tokens']}"
            )
        fields["window_tokens"] = window
    try:
        return PromptSpec(**fields)
    except (TypeError, ValueError) as e:
        raise PromptSpecError(f"invalid prompt spec for model {model!r}: {e}") from e


@dataclass(frozen=True)
class ProxyParams:
    """How the proxy runs; what it is shown is its :class:`PromptSpec`."""

    temperature: float = 0.0
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
    # The caller's ranking of ``sessions`` (ids, best first), if it has one: what a partial or
    # failed parse is completed from, and the order of candidates the prompt could not hold.
    prior: Sequence[str] | None = None


class Proxy:
    """``spec`` decides the prompt (see the module doc); ``coarse`` defaults to
    ``build_filter(spec.coarse)`` (the recall service passes a thread-safe one)."""

    def __init__(
        self,
        backend: Backend,
        spec: PromptSpec,
        coarse: Any = None,
        config: ProxyParams = ProxyParams(),
    ) -> None:
        if not isinstance(spec, PromptSpec):
            raise TypeError(
                "Proxy(backend, spec, coarse=None, config=ProxyParams()): spec must be a "
                f"PromptSpec (see resolve_spec), got {type(spec).__name__}"
            )
        if spec.ranking_head == "first_token":
            from memsifter.ranker.first_token import check_backend

            check_backend(backend)  # the head needs the logits: refused now, not per request
        self.backend = backend
        self.spec = spec
        self.config = config
        self.builder = spec.builder(backend.tokenizer, coarse)
        self.coarse = self.builder.coarse
        self.name = f"memsifter[{backend.model_name}]"

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

    def _payload(self, prompt: BuiltPrompt) -> Any:
        """What the backend is sent: the prompt's token ids when it takes ids (the ids counted
        are the ids the model sees, and the server skips tokenizing), else the rendered text."""
        if prompt.token_ids is not None and getattr(self.backend, "accepts_token_ids", False):
            return list(prompt.token_ids)
        return prompt.text

    def rank_many(self, requests: Sequence[RankRequest]) -> list[ProxyRanking]:
        prompts = [self.builder.build(r.question, r.sessions, r.question_date) for r in requests]
        if self.spec.ranking_head == "first_token":
            return self._rank_by_head(requests, prompts)
        sampling = SamplingParams(
            max_new_tokens=self.spec.completion_tokens, temperature=self.config.temperature
        )
        out: list[ProxyRanking] = []
        for start in range(0, len(prompts), self.config.batch_size):
            chunk = prompts[start : start + self.config.batch_size]
            gens = self.backend.generate([self._payload(p) for p in chunk], sampling)
            for req, prompt, gen in zip(requests[start:], chunk, gens, strict=False):
                out.append(self._read(req, prompt, gen[0]))
        return out

    def _rank_by_head(
        self, requests: Sequence[RankRequest], prompts: list[BuiltPrompt]
    ) -> list[ProxyRanking]:
        """One forward pass a prompt; the ranking is written as the completion ``generate``
        would produce, so it is read (and completed, and mapped to ids) the same way."""
        import time

        from memsifter.ranker.first_token import backend_rankings, ranking_text

        t0 = time.perf_counter()
        orders = backend_rankings(
            self.backend,
            [p.text for p in prompts],
            [p.num_candidates for p in prompts],
            self.config.batch_size,
            payloads=[self._payload(p) for p in prompts],
        )
        latency = time.perf_counter() - t0
        out = []
        for req, prompt, order in zip(requests, prompts, orders, strict=True):
            gen = Generation(
                text=ranking_text(order),
                prompt_tokens=prompt.n_tokens,
                completion_tokens=0,
                finish_reason="stop",
                latency_s=latency,
            )
            out.append(self._read(req, prompt, gen))
        return out

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

    def _read(self, req: RankRequest, prompt: BuiltPrompt, gen: Generation) -> ProxyRanking:
        parsed = parse_ranking(gen.text, prompt.num_candidates)
        if self.config.complete_with_coarse and len(parsed.ids) < prompt.num_candidates:
            parsed = parsed.complete(self._fallback(req, prompt))
        dropped = tuple(prompt.dropped_ids)
        if req.prior is not None and dropped:
            dropped = tuple(dropped[i] for i in _prior_positions(req.prior, dropped))
        ids = prompt.session_ids(parsed) + dropped
        return ProxyRanking(
            ranking=Ranking(ids=ids, source=self.name), parsed=parsed, prompt=prompt, generation=gen
        )


def _prior_positions(prior: Sequence[str], ids: Sequence[str]) -> tuple[int, ...]:
    """Positions of ``ids`` in ``prior``'s order; ids ``prior`` lacks follow in their own order."""
    rank = {sid: i for i, sid in enumerate(prior)}
    end = len(rank)
    return tuple(sorted(range(len(ids)), key=lambda i: (rank.get(ids[i], end), i)))
