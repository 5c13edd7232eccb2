"""The benchmarks' configs: what ``memsifter eval retrieval``, ``eval qa`` and ``eval proxy`` run.

They live here, apart from the benchmarks (as TRL keeps ``GRPOConfig`` beside ``GRPOTrainer``),
because the command line is built from them when it starts (:mod:`memsifter.config_cli`): this
module imports nothing heavy, while the benchmarks load models, numpy and ir-measures. Every field
carries its help (:func:`memsifter.config.setting`); the field is its flag, its help the flag's
help. The benchmark modules re-export their config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memsifter.config import setting
from memsifter.data.locations import DEFAULT_LOCOMO
from memsifter.errors import MemSifterError
from memsifter.llm import BackendSpec

N_BOOTSTRAP = 10_000
PROXY_EVAL_OUT = "outputs/proxy_eval"


@dataclass
class RetrievalEvalConfig:
    """Everything the retrieval benchmark needs; the CLI flags override these fields."""

    dataset: str = setting("locomo", help="locomo | longmemeval | memsifter | jsonl | gym")
    data: str = setting(DEFAULT_LOCOMO, help="dataset file")
    retrievers: list[str] = setting(
        default_factory=lambda: ["bm25"],
        help="coarse filter specs (bm25, minilm, wordllama, bge-m3[:DIR], st:MODEL, hybrid:A+B), "
        "or memsifter: the proxy behind its coarse filter",
    )
    haystack: str = setting("native", help="native | 32k | 128k | 1m | <tokens>")
    conversations: list[str] | None = setting(
        None, help="conversation ids or 0-based indexes; default: all"
    )
    out: str = setting("outputs/retrieval", help="output folder")
    seed: int = setting(0, help="haystack seed")
    tokenizer: str | None = setting(
        None, help="tokenizer (hub id or folder) for exact token budgets; default: approx regex"
    )
    max_questions: int | None = setting(None, help="smoke runs: the first N scoreable questions")
    sample_questions: int | None = setting(
        None,
        help="a seeded random N of the scoreable questions (seed: --seed), kept in file order: "
        "a costly filter on a large set; reports say n",
    )
    recall_max_k: int = setting(20, help="the recall@k curve's largest k")
    longmemeval_text: str = setting(
        "user",
        help="LongMemEval: user (index a session by its user turns only, as the benchmark's "
        "published retrieval numbers do) | all (whole sessions, like every other dataset)",
    )
    embedding_cache: str | None = setting(
        None,
        help="folder that keeps dense filters' passage vectors across runs (and across a hybrid "
        "and its dense member); default: embed afresh in every run",
    )
    # --- the proxy (retriever "memsifter"): coarse -> proxy ---
    model: str = setting(
        "smollm2-135m-instruct",
        help="proxy model for retriever memsifter: hub id, folder, built-in name or adapter folder",
    )
    backend: str = setting("transformers", help="proxy backend: transformers | openai | vllm")
    base_url: str | None = setting(None, help="openai backend server URL (http://host:port/v1)")
    proxy_batch_size: int = setting(4, help="proxy prompts per generate call")
    proxy_temperature: float = setting(
        0.0,
        help="proxy sampling temperature: 0 is greedy; the released proxy's authors sample at 0.6",
    )
    # The proxy's prompt is its PromptSpec: the prompt_spec.json in the model's folder, or for a
    # model without one these explicit settings (PromptSpec fields, or a prompt_spec.json path).
    # A model with its own spec takes none that contradict it. The four below are the older
    # flags' names for spec fields (None: not given).
    prompt: dict[str, Any] | str | None = setting(
        None,
        help="the proxy's prompt spec (a prompt_spec.json, or a folder with one; in YAML also a "
        "mapping of its fields) for a model without its own; a trained model's folder carries it",
    )
    coarse: str | None = setting(
        None,
        help="coarse filter in front of the proxy (spec.coarse: it cuts and completes the prompt)",
    )
    coarse_budget: int | None = setting(
        None,
        help="proxy prompt budget in tokens: its window minus the completion budget "
        "(spec.budget_tokens)",
    )
    proxy_completion_tokens: int | None = setting(
        None, help="proxy completion budget (think + ranking) in tokens (spec.completion_tokens)"
    )
    proxy_language: str | None = setting(
        None, help="proxy prompt language: en | zh (spec.language)"
    )

    def backend_spec(self) -> BackendSpec:
        """The proxy's LLM (retriever ``memsifter``)."""
        return BackendSpec(kind=self.backend, model=self.model, base_url=self.base_url)


@dataclass
class QAEvalConfig:
    """Everything the QA benchmark needs: the retriever, the answerer, the judge, the proxy."""

    dataset: str = setting("locomo", help="locomo | longmemeval | memsifter | jsonl | gym")
    data: str = setting(DEFAULT_LOCOMO, help="dataset file")
    retriever: str = setting(
        "bm25", help="coarse filter spec, memsifter (the proxy), full, or none"
    )
    top_k: int = setting(5, help="sessions given to the answerer")
    answerer: str = setting("smollm2-135m-instruct", help="working LLM")
    answerer_backend: str = setting("transformers", help="transformers | openai | vllm")
    answerer_base_url: str | None = setting(None, help="openai answerer URL")
    answerer_window: int = setting(8192, help="answerer context window")
    answer_tokens: int = setting(48, help="answerer completion budget in tokens")
    memory_order: str = setting(
        "rank", help="how the answerer shows the top k: rank | chronological"
    )
    answer_prompt: str = setting(
        "ours",
        help="answerer prompt: ours, or locomo (LoCoMo's published prompting: category-5 "
        "forced choice, category-2 date hint; LoCoMo only)",
    )
    # The LLM judge (J); none without judge_model. openai needs judge_base_url.
    judge_model: str | None = setting(
        None,
        help="LLM judge (J); none by default. LongMemEval uses its own per-type prompts; "
        "smollm2-135m-instruct with judge backend transformers is an offline pipeline check, "
        "not a result",
    )
    judge_backend: str = setting("openai", help="judge backend: openai | transformers | vllm")
    judge_base_url: str | None = setting(
        None, help="OpenAI-compatible judge server URL (http://host:port/v1)"
    )
    judge_rubric: str = setting(
        "mem0",
        help="J's rubric (not LongMemEval): mem0 (the Mem0 paper's prompt) | memsifter (strict "
        "yes/no)",
    )
    judge_max_new_tokens: int | None = setting(
        None, help="judge completion budget; default: what the rubric's reply needs"
    )
    batch_size: int = setting(4, help="prompts per generate call (answerer and proxy)")
    conversations: list[str] | None = setting(
        None, help="conversation ids or 0-based indexes; default: all"
    )
    max_questions: int | None = setting(None, help="first N questions")
    include_no_evidence: bool = setting(
        True,
        help="score questions without evidence too (QA can score every question; retrieval "
        "metrics cannot)",
    )
    out: str = setting("outputs/qa", help="output folder")
    # the proxy, when retriever == "memsifter" (same fields as eval retrieval): its prompt is the
    # model's own prompt_spec.json, or for a model without one the explicit settings below
    model: str = setting("smollm2-135m-instruct", help="proxy model (retriever memsifter)")
    backend: str = setting("transformers", help="proxy backend")
    base_url: str | None = setting(None, help="proxy openai URL")
    prompt: dict[str, Any] | str | None = setting(
        None,
        help="the proxy's prompt_spec.json (or a folder with one; in YAML also a mapping of its "
        "fields), if the model has none",
    )
    coarse: str | None = setting(
        None, help="coarse filter before the proxy (spec.coarse; default: not given)"
    )
    coarse_budget: int | None = setting(
        None, help="proxy prompt budget in tokens (window minus completion; spec.budget_tokens)"
    )
    proxy_completion_tokens: int | None = setting(
        None, help="proxy completion budget (think + ranking) in tokens (spec.completion_tokens)"
    )
    extra: dict[str, Any] = setting(
        default_factory=dict, help="free-form notes recorded in config.json; no effect on the run"
    )

    def answerer_spec(self) -> BackendSpec:
        """The working LLM that answers from the retrieved memory."""
        return BackendSpec(
            kind=self.answerer_backend, model=self.answerer, base_url=self.answerer_base_url
        )

    def judge_spec(self) -> BackendSpec:
        """The LLM judge (only meaningful when ``judge_model`` is set)."""
        return BackendSpec(
            kind=self.judge_backend, model=str(self.judge_model), base_url=self.judge_base_url
        )


@dataclass
class ProxyEvalConfig:
    """Everything ``memsifter eval proxy`` needs; the CLI flags fill these fields."""

    data: str = setting(help="RL data folder (memsifter data rl)")
    split: str = setting("test", help="train | validation | test")
    models: list[tuple[str, str]] = setting(
        default_factory=list,
        help="NAME=PATH; PATH a model folder, adapter folder or built-in name",
    )
    runs: list[tuple[str, str]] = setting(
        default_factory=list,
        help="NAME=FILE: a model's saved run (runs/*.jsonl of an earlier eval of this split), "
        "re-scored instead of regenerated",
    )
    explicit_spec: list[str] = setting(
        default_factory=list,
        help="model NAME without prompt_spec.json to evaluate on the data's spec",
    )
    fuse: list[str] = setting(
        default_factory=list, help="model NAME: add NAME+<coarse> (RRF with the coarse)"
    )
    pairs: list[str] = setting(
        default_factory=list, help="A-B: paired bootstrap 95% CIs of A minus B"
    )
    max_questions: int | None = setting(None, help="seeded random sample of N scoreable questions")
    seed: int = setting(0, help="question sample and bootstrap seed")
    n_bootstrap: int = setting(N_BOOTSTRAP, help="bootstrap resamples")
    batch_size: int = setting(4, help="prompts per generate call")
    threads: int | None = setting(None, help="torch threads")
    invariance: bool = setting(
        True,
        help="the order-invariance check: every model re-ranks each prompt under seeded "
        "permutations of the shown order (costs PERMUTATIONS more answers a question)",
    )
    permutations: int = setting(5, help="permutations a prompt in the invariance check (>= 2)")
    invariance_questions: int | None = setting(
        None, help="a seeded sample of N scored questions for the invariance check; default all"
    )
    out: str = setting(PROXY_EVAL_OUT, help="output folder (runs/ and default reports)")
    out_md: str | None = setting(None, help="markdown report; default OUT/report.md")
    out_json: str | None = setting(None, help="json metrics; default OUT/metrics.json")
    model_name: str | None = setting(None, help="the json's model field")
    start: str | None = setting(None, help="the json's start field (sft, base, …)")

    @property
    def md_path(self) -> Path:
        return Path(self.out_md) if self.out_md else Path(self.out) / "report.md"

    @property
    def json_path(self) -> Path:
        return Path(self.out_json) if self.out_json else Path(self.out) / "metrics.json"


def parse_model_option(value: str, flag: str = "--model") -> tuple[str, str]:
    """``NAME=PATH`` -> ``(NAME, PATH)``."""
    name, sep, path = value.partition("=")
    name, path = name.strip(), path.strip()
    if not sep or not name or not path:
        raise MemSifterError(f"{flag} {value!r}: write NAME=PATH")
    return name, path


__all__ = [
    "N_BOOTSTRAP",
    "PROXY_EVAL_OUT",
    "ProxyEvalConfig",
    "QAEvalConfig",
    "RetrievalEvalConfig",
    "parse_model_option",
]
