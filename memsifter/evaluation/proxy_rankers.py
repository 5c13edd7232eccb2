"""The proxy benchmark's rankers: each one's ranking of every scored question, as a
:class:`RankerRun` -- the coarse order, a model's greedy answers (its prompt spec checked against
the data's first), a run file saved earlier, or a model fused with the coarse order by RRF."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memsifter.coarse.hybrid import rrf
from memsifter.errors import DataError, MemSifterError
from memsifter.evaluation.invariance import Order, PermutedAnswer, permutations_for, to_original
from memsifter.evaluation.proxy_data import EvalData, Question, seeded_sample
from memsifter.ranker.checkpoint import SPEC_FILE, read_spec, spec_differences, spec_file
from memsifter.ranker.spec import PromptSpec

RRF_K = 60.0

# (model path, batch_size, threads) -> a backend with ``generate(prompts, SamplingParams)``.
BackendFactory = Callable[[str, int, "int | None"], Any]


# --------------------------------------------------------------------------- model specs


def check_model_spec(
    name: str, path: str, data_spec: PromptSpec, data_folder: str | Path, explicit: bool
) -> str:
    """Refuse a model that would be evaluated on a prompt it was not trained on. Returns how its
    spec was settled: ``"match"`` or ``"explicit"``."""
    own = spec_file(path)
    if own is not None:
        diff = spec_differences(read_spec(own.parent), data_spec)
        if diff:
            fields = "; ".join(f"{k}: model {m!r} vs data {d!r}" for k, (m, d) in diff.items())
            raise MemSifterError(
                f"model {name!r} ({own}) was trained on another prompt than the data "
                f"({Path(data_folder) / SPEC_FILE}): {fields}"
            )
        return "match"
    if not explicit:
        raise MemSifterError(
            f"model {name!r} ({path}) has no {SPEC_FILE}, so nothing says it was trained on "
            f"the data's prompt ({Path(data_folder) / SPEC_FILE}); pass "
            f"--explicit-spec {name} to evaluate it on the data's spec"
        )
    return "explicit"


# --------------------------------------------------------------------------- rankers


@dataclass
class RankerRun:
    """One ranker's answers, aligned with ``EvalData.questions``."""

    name: str
    kind: str  # coarse | model | fused
    rankings: list[list[int]]
    parsed_ok: list[bool] | None = None  # model and fused rows
    completions: list[str] | None = None  # model rows
    errors: list[str | None] | None = None  # model rows: parse error kinds
    latency_ms: list[float] | None = None  # model rows, per question
    path: str | None = None
    spec_check: str | None = None  # match | explicit
    load_seconds: float | None = None
    # The order-invariance check (memsifter.evaluation.invariance): per question, the answers
    # under its permutations (empty where none was asked), and the answers on the original
    # order they are compared with (None: ``rankings``).
    permuted: list[list[PermutedAnswer]] | None = None
    permuted_base: list[list[int]] | None = None

    @property
    def parse_rate(self) -> float | None:
        if self.kind != "model" or self.parsed_ok is None:
            return None
        return sum(self.parsed_ok) / len(self.parsed_ok) if self.parsed_ok else 0.0


def invariance_orders(
    data: EvalData, k: int, seed: int, max_questions: int | None = None
) -> list[list[Order]]:
    """Per scored question, the orders the invariance check shows it in (:func:`~memsifter.
    evaluation.invariance.permutations_for`); none for a question outside the seeded sample of
    ``max_questions``, or whose prompt cut a session short (its candidates column holds the
    whole session, so a new rendering would not show what the prompt did)."""
    qs = data.questions
    orders: list[list[Order]] = [[] for _ in qs]
    for i in seeded_sample(len(qs), max_questions, seed):
        q = qs[i]
        if not q.truncated:
            orders[i] = permutations_for(q.qid, q.n_candidates, k, seed)
    return orders


def coarse_run(data: EvalData, orders: Sequence[Sequence[Order]] | None = None) -> RankerRun:
    """The coarse order of each question. With ``orders``, the coarse filter also ranks each
    question's candidates again in each order: the data's coarse order was made over the whole
    haystack (its IDF included), so the check compares the re-ranks with the re-rank of the
    original order, the same candidates."""
    run = RankerRun(data.spec.coarse, "coarse", [list(q.coarse_order) for q in data.questions])
    if orders is None or not any(orders):
        return run
    from memsifter.coarse import build_filter

    coarse = build_filter(data.spec.coarse)

    def ranked(q: Question, sessions: Sequence[Any], order: Order) -> tuple[int, ...]:
        shown = [sessions[i] for i in order]
        position = {s.id: j for j, s in enumerate(shown)}
        return to_original(order, [position[sid] for sid in coarse.score(q.question, shown).ids])

    run.permuted, run.permuted_base = [], []
    for q, q_orders in zip(data.questions, orders, strict=True):
        sessions = q.sessions() if q_orders else ()
        identity = tuple(range(q.n_candidates))
        run.permuted_base.append(list(ranked(q, sessions, identity)) if q_orders else [])
        run.permuted.append([PermutedAnswer(o, ranked(q, sessions, o)) for o in q_orders])
    return run


def default_backend_factory(path: str, batch_size: int, threads: int | None) -> Any:
    from memsifter import llm

    spec = llm.BackendSpec(kind="transformers", model=path, batch_size=batch_size, threads=threads)
    return llm.build_backend(spec)


def model_run(
    name: str,
    path: str,
    backend: Any,
    data: EvalData,
    batch_size: int = 4,
    progress: Any = None,
    orders: Sequence[Sequence[Order]] | None = None,
) -> RankerRun:
    """Greedy answers (generated, or the first-token head's) on every scored prompt,
    ``batch_size`` prompts a call, through the proxy opened on ``path`` (its spec checked
    against the data's: :func:`check_model_spec`); latency per question is the call's wall time
    shared by its prompts. With ``orders``, also its answers under the invariance check's
    permutations (:func:`permuted_answers`)."""
    from memsifter.ranker.proxy import Proxy, ProxyParams, RenderedPrompt

    qs = data.questions
    task = progress.add_task(name, total=len(qs)) if progress is not None else None
    latency: list[float] = []

    def heard(n: int, seconds: float) -> None:
        latency.extend([seconds * 1000 / n] * n)
        if progress is not None:
            progress.advance(task, n)

    proxy = Proxy.from_pretrained(
        path,
        backend=backend,
        params=ProxyParams(batch_size=max(batch_size, 1)),
        prompt=data.spec,
    )
    answers = proxy.answer(
        [RenderedPrompt(q.prompt, q.n_candidates, q.coarse_order) for q in qs], heard
    )
    parsed = [a.parsed for a in answers]
    run = RankerRun(
        name,
        "model",
        [list(p.ids) for p in parsed],  # never completed: a failure ranks nothing
        parsed_ok=[p.ok for p in parsed],
        completions=[a.generation.text for a in answers],
        errors=[p.error.value if p.error else None for p in parsed],
        latency_ms=latency,
    )
    if orders is not None:
        run.permuted = permuted_answers(name, proxy, data, orders, progress)
    return run


def permuted_answers(
    name: str, proxy: Any, data: EvalData, orders: Sequence[Sequence[Order]], progress: Any = None
) -> list[list[PermutedAnswer]]:
    """The proxy's answers to each question shown in each of its ``orders``, rendered by the
    proxy's own builder from the row's candidates. The original order must render the row's
    prompt byte for byte first, so a permuted prompt differs from it in the order alone."""
    from memsifter.ranker.proxy import RenderedPrompt

    builder = proxy.builder
    prompts: list[RenderedPrompt] = []
    for q, q_orders in zip(data.questions, orders, strict=True):
        if not q_orders:
            continue
        sessions = q.sessions()
        again = builder.build_shown(q.question, sessions, q.question_date).text
        if again != q.prompt:
            raise MemSifterError(
                f"model {name!r}: question {q.qid} renders differently from its row's prompt "
                "with this model's tokenizer and the data's spec, so a permuted prompt would "
                "differ in more than its order; the invariance check needs the data's renderer "
                "(--no-invariance skips it)"
            )
        for order in q_orders:
            shown = [sessions[i] for i in order]
            built = builder.build_shown(q.question, shown, q.question_date)
            # The same coarse opinion, in the shown positions (a fused head reads it there).
            where = {p: j for j, p in enumerate(order)}
            coarse = tuple(where[p] for p in q.coarse_order)
            prompts.append(RenderedPrompt(built.text, q.n_candidates, coarse))
    heard = None
    if progress is not None:
        task = progress.add_task(f"{name} permuted", total=len(prompts))

        def heard(n: int, _seconds: float) -> None:
            progress.advance(task, n)

    answers = iter(proxy.answer(prompts, heard))
    out: list[list[PermutedAnswer]] = []
    for q_orders in orders:
        row = []
        for order in q_orders:
            a = next(answers)
            row.append(PermutedAnswer(order, to_original(order, a.parsed.ids), a.generation.text))
        out.append(row)
    return out


def saved_run(name: str, path: str | Path, data: EvalData) -> RankerRun:
    """A model row from a run file this command wrote earlier on the same split: every scored
    question must be in it; each completion is parsed again and must give the ranking the file
    records (so a hand-edited file or a changed parser is refused, not silently re-scored)."""
    file = Path(path)
    if not file.is_file():
        raise DataError("saved run file not found", file=str(file))
    records: dict[str, dict[str, Any]] = {}
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            qid, completion = str(rec["qid"]), rec["completion"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataError(
                f"line {n}: not a run record with qid and completion ({e})", file=str(file)
            ) from e
        if not isinstance(completion, str):
            raise DataError(f"line {n} ({qid}): a model run needs its completion", file=str(file))
        records[qid] = rec
    missing = [q.qid for q in data.questions if q.qid not in records]
    if missing:
        raise DataError(
            f"{len(missing)} of the {len(data.questions)} scored questions are not in the run "
            f"(first: {missing[0]}); it was made on other questions",
            file=str(file),
        )
    rankings, ok, texts, errors, latency = [], [], [], [], []
    with_permuted = sum("permuted" in records[q.qid] for q in data.questions)
    if with_permuted not in (0, len(data.questions)):
        raise DataError(
            f"{with_permuted} of the {len(data.questions)} scored questions carry invariance "
            "answers ('permuted') and the others none: the run mixes two evals",
            file=str(file),
        )
    permuted: list[list[PermutedAnswer]] | None = [] if with_permuted else None
    for q in data.questions:
        rec = records[q.qid]
        if permuted is not None:
            permuted.append(_saved_permuted(rec["permuted"], q, file, data.spec))
        parsed = data.spec.parse(rec["completion"], q.n_candidates)
        if "ranking" in rec and list(rec["ranking"]) != list(parsed.ids):
            raise DataError(
                f"{q.qid}: the recorded ranking {rec['ranking']} is not what its completion "
                f"parses to {list(parsed.ids)}",
                file=str(file),
            )
        rankings.append(list(parsed.ids))
        ok.append(parsed.ok)
        texts.append(rec["completion"])
        errors.append(parsed.error.value if parsed.error else None)
        latency.append(rec.get("latency_ms"))
    return RankerRun(
        name,
        "model",
        rankings,
        parsed_ok=ok,
        completions=texts,
        errors=errors,
        # Runs written before latency was recorded carry none: the row says so rather than 0.
        latency_ms=None if any(x is None for x in latency) else [float(x) for x in latency],
        path=str(file),
        spec_check="saved run",
        permuted=permuted,
    )


def _saved_permuted(
    records: Any, q: Question, file: Path, spec: PromptSpec
) -> list[PermutedAnswer]:
    """A saved run's invariance answers to one question, parsed again like its completion."""
    out = []
    try:
        for rec in records:
            order = tuple(int(i) for i in rec["order"])
            if sorted(order) != list(range(q.n_candidates)):
                raise ValueError(f"order {list(order)} is not a permutation of its candidates")
            parsed = spec.parse(rec["completion"], q.n_candidates)
            ranking = to_original(order, parsed.ids)
            if "ranking" in rec and list(rec["ranking"]) != list(ranking):
                raise ValueError(
                    f"the recorded ranking {rec['ranking']} is not what its completion parses "
                    f"to under its order {list(ranking)}"
                )
            out.append(PermutedAnswer(order, ranking, rec["completion"]))
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(f"{q.qid}: a malformed invariance answer: {e}", file=str(file)) from e
    return out


def fuse_order(
    model_ids: Sequence[int], coarse_order: Sequence[int], k: float = RRF_K
) -> list[int]:
    """RRF of the model's ranking with the coarse order over every candidate (the coarse order
    lists them all); ties keep the coarse order."""
    coarse = np.asarray(coarse_order, dtype=np.int64)
    fused = rrf([np.asarray(model_ids, dtype=np.int64), coarse], len(coarse), k)
    return coarse[np.argsort(-fused[coarse], kind="stable")].tolist()


def fused_run(model: RankerRun, data: EvalData, coarse_name: str) -> RankerRun:
    """The model's ranking fused with the data's coarse order; under the invariance check, the
    model's permuted answers fused with the same coarse order (a ranking of the candidates,
    whatever order they are shown in)."""
    qs = data.questions
    permuted = None
    if model.permuted is not None:
        permuted = [
            [PermutedAnswer(a.order, tuple(fuse_order(a.ranking, q.coarse_order))) for a in answers]
            for answers, q in zip(model.permuted, qs, strict=True)
        ]
    return RankerRun(
        f"{model.name}+{coarse_name}",
        "fused",
        [fuse_order(ids, q.coarse_order) for ids, q in zip(model.rankings, qs, strict=True)],
        parsed_ok=model.parsed_ok,
        permuted=permuted,
    )


__all__ = [
    "RRF_K",
    "BackendFactory",
    "RankerRun",
    "check_model_spec",
    "coarse_run",
    "default_backend_factory",
    "fuse_order",
    "fused_run",
    "invariance_orders",
    "model_run",
    "permuted_answers",
    "saved_run",
]
