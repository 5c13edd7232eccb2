"""Validate a checkpoint on the held-out split: greedy rankings, NDCG@1/5 of the gold sessions
and the mean outcome reward.

NDCG is the reward module's :func:`~memsifter.rewards.retrieval.retrieval_reward` (one home for
DCG); a completion that does not parse ranks nothing and scores 0 (no completion from the coarse
order here: we are measuring the model). The reward is the reward function the trainer uses,
at a step where the warm-up has decayed (so R = alpha * R_ans), so checkpoints are compared on
the outcome the paper optimises. The rankings are written out as JSONL
(``{"qid", "ranking"}``), which the curriculum can score the next round with.

The model is opened by :meth:`~memsifter.ranker.proxy.Proxy.from_pretrained` and answers through
:meth:`~memsifter.ranker.proxy.Proxy.answer`, the generate -> parse path eval and serving use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memsifter.errors import DataError
from memsifter.ranker.proxy import Proxy, ProxyAnswer, ProxyParams, RenderedPrompt
from memsifter.rewards.retrieval import retrieval_reward
from memsifter.rewards.trl import RewardFunction
from memsifter.training.rldata.curriculum import write_rankings

if TYPE_CHECKING:
    from memsifter.llm import BackendSpec
    from memsifter.ranker.spec import PromptSpec
    from memsifter.training.config import TrainConfig

# Far past any warm-up: beta(t) = 0, so the validation reward is alpha * R_ans.
_AFTER_WARMUP = 10**9


@dataclass
class ValidationResult:
    model: str
    questions: int
    parse_rate: float
    ndcg_1: float
    ndcg_5: float
    reward: float
    seconds: float
    # NDCG@1 of the useful session, on the rows that know one (the memory gym); None elsewhere.
    # Reported to show learning, never a select_metric: the useful session is not a label
    # the recipe may train or choose on.
    ndcg_1_useful: float | None = None

    def metric(self, name: str) -> float:
        return {"ndcg@1": self.ndcg_1, "ndcg@5": self.ndcg_5, "reward": self.reward}[name]


def check_select_metric(cfg: TrainConfig, reward_config: Any) -> None:
    """Refuse ``epochs.select_metric: reward`` where validation's reward is 0 for every model:
    it reads ``alpha * R_ans`` after the warm-up, so a retrieval-only reward (alpha 0, such as
    R_ret on the labels) would rank every checkpoint, and the start, equal."""
    if cfg.epochs.select_metric == "reward" and reward_config.alpha == 0:
        raise DataError(
            f"epochs.select_metric is reward, which validation reads as alpha * R_ans after the "
            f"warm-up, and {cfg.reward} has alpha 0: every checkpoint (and the start) would "
            "score 0, so the averaged checkpoints and keep_start_if_better would be chosen by "
            "ties. Select by this reward's own metric, ndcg@5 or ndcg@1",
            field="epochs.select_metric",
        )


@dataclass(frozen=True)
class ValidationEngine:
    """How validation and the curriculum's re-score generate: greedy, with the backend the
    run's ``epochs.validation_backend`` names, built for each model folder and released after
    it (a vLLM engine holds most of its GPU until shut down)."""

    backend: str = "transformers"  # transformers | vllm
    engine_args: Mapping[str, Any] = field(default_factory=dict)  # vllm.LLM arguments
    batch_size: int = 8  # transformers
    threads: int | None = None  # transformers on CPU
    # The PromptSpec's ranking head: ``first_token`` ranks by one forward pass (transformers),
    # whatever the backend, and writes the ranking as the completion ``generate`` would.
    ranking_head: str = "generate"
    # The data's labelling (digits | letters) for the head; None: the checkpoint's own spec's
    # (digits for a model without one). A checkpoint trained with the other one is refused.
    labels: str | None = None
    # Where the head reads its scores (label | marker), from the data's spec like the labels.
    head_read: str | None = None
    # The data's prompt layout, which the marker read needs to agree with a checkpoint's own.
    layout: str | None = None
    # Where the head's forward runs; None: the GPU when there is one (a lent GPU's CPUs would
    # spend minutes a checkpoint), else the CPU. fp32 either way: the checkpoint's own dtype.
    device: str | None = "cpu"

    @classmethod
    def for_spec(cls, spec: PromptSpec, **kwargs: Any) -> ValidationEngine:
        """The engine that reads prompts rendered with ``spec`` (its head, labels, read and
        layout; a checkpoint of another is refused), with ``kwargs`` for the rest."""
        head = spec.ranking_head == "first_token"
        return cls(
            ranking_head=spec.ranking_head,
            labels=spec.labels if head else None,
            head_read=spec.head_read if head else None,
            layout=spec.layout if head else None,
            **kwargs,
        )

    @classmethod
    def from_config(cls, cfg: TrainConfig, ranking_head: str = "generate") -> ValidationEngine:
        """``ranking_head`` is the run's data's (``read_spec(cfg.data).ranking_head``); with the
        head, so are its labels, read here so every model validated (the start model too, with
        no spec of its own) is read at the labels its prompts were rendered with."""
        args = dict(cfg.epochs.validation_engine_args)
        if cfg.epochs.validation_backend == "vllm" and cfg.model.context_tokens is not None:
            args.setdefault("max_model_len", cfg.model.context_tokens)
        return cls(
            backend=cfg.epochs.validation_backend,
            engine_args=args,
            threads=cfg.threads,
            ranking_head=ranking_head,
            labels=_data_spec(cfg.data, "labels") if ranking_head == "first_token" else None,
            head_read=_data_spec(cfg.data, "head_read") if ranking_head == "first_token" else None,
            layout=_data_spec(cfg.data, "layout") if ranking_head == "first_token" else None,
            device=None,
        )

    def spec(self, model_path: str | Path) -> BackendSpec:
        from memsifter.llm import BackendSpec

        if self.ranking_head == "first_token":
            # The head reads logits in process whatever the backend, on the checkpoint as
            # saved (its own dtype), on the engine's device.
            return BackendSpec(
                kind="transformers",
                model=str(model_path),
                device=self.device,
                dtype="auto",
                batch_size=self.batch_size,
                threads=self.threads,
            )
        if self.backend == "vllm":
            return BackendSpec(kind="vllm", model=str(model_path), options=dict(self.engine_args))
        if self.backend == "transformers":
            return BackendSpec(
                kind="transformers",
                model=str(model_path),
                batch_size=self.batch_size,
                threads=self.threads,
            )
        raise ValueError(f"validation backend must be transformers or vllm, not {self.backend!r}")

    def proxy(self, model_path: str | Path, max_new_tokens: int) -> Proxy:
        """The model as validation runs it: greedy, capped at ``max_new_tokens``. The prompts
        are rendered already, so all it must agree on with a checkpoint's own spec is the head;
        a generating backend gets every prompt at once and batches them itself."""
        head = self.ranking_head == "first_token"
        prompt = {
            "ranking_head": self.ranking_head,
            "ask_think": False if head else None,
            "labels": self.labels if head else None,
            "head_read": self.head_read if head else None,
            # The marker read needs its layout; the prompts are rendered already either way.
            "layout": (self.layout or "marked") if head and self.head_read == "marker" else None,
        }
        params = ProxyParams(
            batch_size=self.batch_size if head else None, max_new_tokens=max_new_tokens
        )
        return Proxy.from_pretrained(
            model_path, backend=self.spec(model_path), params=params, prompt=prompt
        )


def _data_spec(data: str | Path, name: str) -> str | None:
    """One field (labels, head_read, layout) of the RL data folder's prompt spec, or None when
    the folder carries no spec."""
    from memsifter.ranker.checkpoint import has_spec, read_spec

    return getattr(read_spec(data), name) if has_spec(data) else None


def answer_rows(
    model_path: str | Path,
    rows: Any,
    *,
    max_new_tokens: int,
    engine: ValidationEngine | None = None,
) -> list[ProxyAnswer]:
    """Greedy answers of the model at ``model_path`` to the rows' rendered ``prompt`` text, parsed
    (never completed): the PromptSpec's renderer made that text, so nothing is templated here.
    The backend is released afterwards (a vLLM engine holds its GPU until then)."""
    prompts: list[RenderedPrompt] = []
    for r in rows:
        if not isinstance(r["prompt"], str):
            raise ValueError(
                "RL data rows must carry the rendered prompt text in `prompt`; rebuild the data "
                "with `memsifter data rl`"
            )
        coarse = r.get("coarse_order") if hasattr(r, "get") else None
        prompts.append(
            RenderedPrompt(
                r["prompt"],
                int(r["n_candidates"]),
                tuple(int(p) for p in coarse) if coarse is not None else None,
            )
        )
    proxy = (engine or ValidationEngine()).proxy(model_path, max_new_tokens)
    try:
        return proxy.answer(prompts)
    finally:
        proxy.close()


def generate_completions(
    model_path: str | Path,
    rows: Any,
    *,
    max_new_tokens: int,
    engine: ValidationEngine | None = None,
) -> list[str]:
    """The completions of :func:`answer_rows` (the first-token head's written as generate's)."""
    answers = answer_rows(model_path, rows, max_new_tokens=max_new_tokens, engine=engine)
    return [a.generation.text for a in answers]


def rank_rows(
    model_path: str | Path,
    rows: Any,
    out: Path,
    *,
    max_new_tokens: int,
    engine: ValidationEngine | None = None,
) -> tuple[Path, float]:
    """A previous model's rankings of ``rows`` as a curriculum rankings file (a completion that
    does not parse ranks nothing: NDCG 0). Returns the file and the parse rate."""
    rows = list(rows)
    answers = answer_rows(model_path, rows, max_new_tokens=max_new_tokens, engine=engine)
    pairs = [(str(r["qid"]), list(a.parsed.ids)) for r, a in zip(rows, answers, strict=True)]
    parsed_n = sum(a.parsed.ok for a in answers)
    return write_rankings(out, pairs), parsed_n / max(len(rows), 1)


def validate(
    model_path: str | Path,
    rows: Any,
    reward_fn: RewardFunction,
    *,
    max_new_tokens: int,
    rankings_out: Path | None = None,
    engine: ValidationEngine | None = None,
) -> ValidationResult:
    import time

    t0 = time.perf_counter()
    rows = list(rows)
    answers = answer_rows(model_path, rows, max_new_tokens=max_new_tokens, engine=engine)
    completions = [a.generation.text for a in answers]

    columns = (
        {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "prompt_messages")}
        if rows
        else {}
    )

    class _AtEnd:
        global_step = _AFTER_WARMUP

    rewards = reward_fn(
        prompts=[r["prompt"] for r in rows],
        completions=completions,
        trainer_state=_AtEnd(),
        **columns,
    )
    ndcg1 = ndcg5 = useful1 = 0.0
    parsed_n = with_gold = with_useful = 0
    pairs: list[tuple[str, list[int]]] = []
    for row, answer in zip(rows, answers, strict=True):
        parsed = answer.parsed
        gold = list(row["gold_positions"])
        parsed_n += parsed.ok
        # As in the retrieval benchmark, NDCG averages over questions whose prompt shows gold.
        if gold:
            with_gold += 1
            if parsed.ok:
                ndcg1 += retrieval_reward(parsed.ids, gold, 1)
                ndcg5 += retrieval_reward(parsed.ids, gold, 5)
        useful = list(row.get("useful_positions") or ())
        if useful:
            with_useful += 1
            if parsed.ok:
                useful1 += retrieval_reward(parsed.ids, useful, 1)
        pairs.append((str(row["qid"]), list(parsed.ids)))
    if rankings_out is not None:
        write_rankings(rankings_out, pairs)
    q = max(len(rows), 1)
    return ValidationResult(
        model=str(model_path),
        questions=len(rows),
        parse_rate=parsed_n / q,
        ndcg_1=ndcg1 / max(with_gold, 1),
        ndcg_5=ndcg5 / max(with_gold, 1),
        reward=sum(rewards) / q,
        seconds=time.perf_counter() - t0,
        ndcg_1_useful=useful1 / with_useful if with_useful else None,
    )


def result_dict(result: ValidationResult) -> dict[str, Any]:
    return asdict(result)
