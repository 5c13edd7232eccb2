"""The first-token ranking head: the prompt it needs, exact Plackett–Luce sampling and
log-probabilities, batch-invariant scores, and the PL-GRPO trainer's contract (advantages,
refused settings, an exact resume)."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from memsifter.errors import DataError, MemSifterError  # noqa: E402
from memsifter.ranker.first_token import (  # noqa: E402
    RankingHeadError,
    gumbel_topk,
    head_scores,
    label_token_ids,
    pl_log_prob,
    rank_prompts,
    ranking_text,
)
from memsifter.ranker.spec import PromptSpec  # noqa: E402


def _pl_prob(scores: list[float], order: tuple[int, ...]) -> float:
    left, p = list(range(len(scores))), 1.0
    for i in order:
        z = sum(math.exp(scores[j]) for j in left)
        p *= math.exp(scores[i]) / z
        left.remove(i)
    return p


def test_pl_log_prob_is_the_plackett_luce_probability_and_sums_to_one() -> None:
    scores = [0.3, -1.2, 2.0, 0.0]
    perms = list(itertools.permutations(range(4)))
    logp = pl_log_prob(torch.tensor([scores]), torch.tensor([perms]))[0]
    assert torch.allclose(logp.exp(), torch.tensor([_pl_prob(scores, p) for p in perms]), atol=1e-6)
    assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-5)
    # A top-2 prefix is the probability of that top 2.
    top2 = pl_log_prob(torch.tensor([scores]), torch.tensor([[[2, 0]]]))[0, 0]
    assert float(top2.exp()) == pytest.approx(_pl_prob(scores, (2, 0)), rel=1e-5)


def test_padded_candidates_add_nothing_and_no_nan_gradient() -> None:
    real = torch.tensor([[0.5, -0.5, 1.0]], requires_grad=True)
    padded = torch.cat([real, torch.full((1, 2), float("-inf"))], -1)
    orders = gumbel_topk(padded, 6, generator=torch.Generator().manual_seed(0))
    assert (orders[..., :3] < 3).all() and (orders[..., 3:] >= 3).all()  # padding last
    lp_padded = pl_log_prob(padded, orders)
    lp_real = pl_log_prob(real, orders[..., :3])
    # The padded places add one constant (log 2!) whatever the ranking: advantages see none.
    diff = lp_padded - lp_real
    assert torch.allclose(diff, diff[0, 0].expand_as(diff), atol=1e-5)
    lp_padded.sum().backward()
    assert torch.isfinite(real.grad).all()


def test_gumbel_topk_samples_the_plackett_luce_distribution() -> None:
    scores = torch.tensor([[1.0, 0.0, -1.0]])
    draws = gumbel_topk(scores, 30_000, generator=torch.Generator().manual_seed(1))[0]
    for perm in itertools.permutations(range(3)):
        freq = float((draws == torch.tensor(perm)).all(-1).float().mean())
        assert freq == pytest.approx(_pl_prob([1.0, 0.0, -1.0], perm), abs=0.012)
    hot = gumbel_topk(scores, 30_000, temperature=0.25, generator=torch.Generator().manual_seed(1))
    assert float((hot[0, :, 0] == 0).float().mean()) > 0.95  # colder: the top score first
    with pytest.raises(RankingHeadError, match="temperature"):
        gumbel_topk(scores, 2, temperature=0.0)


def test_ranking_text_is_what_generate_mode_writes() -> None:
    from memsifter.ranker.parse import parse_ranking

    text = ranking_text([3, 0, 4])
    assert text == "<ranking>3, 0, 4</ranking>"
    assert parse_ranking(text, 5).ids == (3, 0, 4)


def test_labels_must_be_single_tokens(tiny_qwen3: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert len(label_token_ids(tok, 10)) == 10
    with pytest.raises(RankingHeadError, match=r"splits '10' into 2 tokens"):
        label_token_ids(tok, 11)
    with pytest.raises(RankingHeadError, match="at least one"):
        label_token_ids(tok, 0)


def test_spec_first_token_turns_thinking_off_and_the_prompt_ends_at_the_tag(
    tiny_qwen3: Path,
) -> None:
    from transformers import AutoTokenizer

    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.data.types import Session, Turn

    with pytest.raises(ValueError, match="ask_think: false"):
        PromptSpec(ranking_head="first_token", ask_think=True)
    with pytest.raises(ValueError, match="ranking_head must be one of"):
        PromptSpec(ranking_head="logits", ask_think=False)
    spec = PromptSpec(
        model=str(tiny_qwen3), window_tokens=2048, completion_tokens=0, ask_think=False,
        ranking_head="first_token",
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    builder = spec.builder(tok, coarse=BM25Filter())

    def session(i: int) -> Session:
        return Session(id=f"s{i}", turns=(Turn("A", f"hi {i}"),), date_text=f"{i + 1} May 2023")

    built = builder.build("where do I live?", [session(i) for i in range(3)])
    assert built.text.endswith("<ranking>")
    generate = PromptSpec(
        model=str(tiny_qwen3), window_tokens=2048, completion_tokens=0, ask_think=False
    ).builder(tok, coarse=BM25Filter())
    assert built.text == generate.build("where do I live?", [session(i) for i in range(3)]).text + (
        "<ranking>"
    )
    # More candidates than single-token labels (10 here): the coarse filter keeps its best 10.
    many = [session(i) for i in range(12)]
    cut = builder.build("where do I live?", many)
    best = set(BM25Filter().score("where do I live?", many).ids[:10])
    assert cut.num_candidates == 10 and set(cut.candidate_ids) == best
    from memsifter.errors import PromptBudgetError
    from memsifter.ranker.prompt import PromptBuilder

    bare = PromptBuilder(tok, 2048, 0, coarse=None, ask_think=False, ranking_head="first_token")
    with pytest.raises(PromptBudgetError, match="10 single-token digit labels"):
        bare.build("where do I live?", many)

    from memsifter.llm.transformers_backend import TransformersBackend
    from memsifter.ranker.proxy import Proxy
    from memsifter.testing.backends import ScriptedBackend

    # An engine that cannot give the logits is refused at start, naming it.
    with pytest.raises(RankingHeadError, match="holds no model to read and returns no logprobs"):
        Proxy(ScriptedBackend.replying(["1, 0</ranking>"], tok), spec, BM25Filter())
    # The one front door ranks with the head: one forward pass, the ids mapped as generate's.
    backend = TransformersBackend(str(tiny_qwen3), batch_size=2)
    proxy = Proxy(backend, spec, BM25Filter())
    sessions = [session(i) for i in range(3)]
    got = proxy.rank("where do I live?", sessions)
    order = rank_prompts(backend.model, tok, [built.text], [3])[0]
    assert got.ranking.ids == tuple(f"s{i}" for i in order)
    assert got.parsed.ok and got.generation.completion_tokens == 0


def _logprob_server(model_path: Path, shape: str, top: int = 20) -> Any:
    """A mock /v1/completions that answers max_tokens-1 logprob requests from the model itself,
    in vLLM's shape (``top_logprobs: [{"token_id:N": lp}]``) or llama-server's (``content``)."""
    import json

    import httpx
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        assert body["max_tokens"] == 1 and isinstance(body["prompt"], list)
        with torch.no_grad():
            logits = model(torch.tensor([body["prompt"]])).logits[0, -1]
        lp = torch.log_softmax(logits.float(), -1)
        values, ids = lp.topk(min(top, body["logprobs"]))
        pairs = list(zip(ids.tolist(), values.tolist(), strict=True))
        if shape == "vllm":
            logprobs = {"top_logprobs": [{f"token_id:{i}": v for i, v in pairs}]}
        elif shape == "llamacpp":
            logprobs = {"content": [{"top_logprobs": [{"id": i, "logprob": v} for i, v in pairs]}]}
        else:
            logprobs = None
        return httpx.Response(200, json={"choices": [{"text": "", "logprobs": logprobs}]})

    return httpx.MockTransport(handler), seen


@pytest.mark.parametrize("shape", ["vllm", "llamacpp"])
def test_a_server_engine_ranks_as_the_in_process_head(tiny_qwen3: Path, shape: str) -> None:
    """The head on an OpenAI-compatible server reads the next token's top logprobs: the same
    ranking as the in-process logits, a label outside the top-k refused by name, and a server
    that returns no logprobs refused loudly (no made-up ranking)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.llm.errors import BackendError
    from memsifter.llm.openai_http import OpenAIBackend
    from memsifter.ranker.first_token import backend_rankings

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3).eval()
    prompts = [f"question {i} with some words " * (i + 1) + "<ranking>" for i in range(6)]
    ns = [3, 5, 4, 2, 6, 5]
    transport, seen = _logprob_server(tiny_qwen3, shape, top=607)  # the whole tiny vocabulary
    be = OpenAIBackend("http://x:1", model=str(tiny_qwen3), transport=transport)
    # A random tiny model spreads its mass: ask for the whole vocabulary.
    assert backend_rankings(be, prompts, ns, top=607) == rank_prompts(model, tok, prompts, ns)
    assert len(seen) == 6 and seen[0]["logprobs"] == 607
    # A server that keeps fewer logprobs than a prompt has labels: named, never guessed.
    few, _ = _logprob_server(tiny_qwen3, shape, top=1)
    short = OpenAIBackend("http://x:1", model=str(tiny_qwen3), transport=few)
    with pytest.raises(RankingHeadError, match="not among the server's top 20"):
        backend_rankings(short, prompts[:1], [3])
    none, _ = _logprob_server(tiny_qwen3, "none")
    silent = OpenAIBackend("http://x:1", model=str(tiny_qwen3), transport=none)
    with pytest.raises(BackendError, match="returned no logprobs"):
        backend_rankings(silent, prompts[:1], [3])


def test_head_scores_are_the_same_alone_and_in_a_padded_batch(tiny_qwen3: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3).eval()
    prompts = ["a short question <ranking>", "a much longer question " * 6 + "<ranking>"]
    with torch.no_grad():
        both = head_scores(model, tok, prompts, [3, 5])
        alone = head_scores(model, tok, prompts[:1], [3])
    assert torch.allclose(both[0, :3], alone[0], atol=1e-4)
    assert torch.isinf(both[0, 3:]).all() and torch.isfinite(both[1]).all()
    # The short row is padded, and the longer one scores the same alone too.
    with torch.no_grad():
        long_alone = head_scores(model, tok, prompts[1:], [5])
    assert torch.allclose(both[1], long_alone[0], atol=1e-4)
    # Right-padded: every row starts with a prompt token, so no causal query attends to
    # nothing (a fully masked row is where fused attention kernels give NaN).
    from memsifter.ranker.first_token import _encode

    batch = _encode(tok, prompts, [3, 5], "digits", "label")
    assert bool(batch.mask[:, 0].all()) and not bool(batch.mask[0, -1])
    assert batch.last.tolist() == [int(batch.mask[0].sum()) - 1, batch.ids.shape[1] - 1]
    orders = rank_prompts(model, tok, prompts, [3, 5])
    assert sorted(orders[0]) == [0, 1, 2] and sorted(orders[1]) == list(range(5))
    assert orders[1] == both[1].argsort(descending=True).tolist()
    with pytest.raises(RankingHeadError, match="does not end with <ranking>"):
        head_scores(model, tok, ["no tag here"], [3])


def _lora_top(model: Any, top: int) -> Any:
    """``model`` with a LoRA on its top ``top`` layers whose B is random (a fresh adapter is
    zero, so the policy and the reference would agree for nothing)."""
    from peft import LoraConfig, get_peft_model

    layers = model.config.num_hidden_layers
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
        layers_to_transform=list(range(layers - top, layers)),
    )  # fmt: skip
    peft = get_peft_model(model, cfg)
    gen = torch.Generator().manual_seed(0)
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            p.data = torch.randn(p.shape, generator=gen) * 0.5
    return peft


@pytest.mark.parametrize("read", ["label", "marker"])
def test_the_trunk_split_scores_as_the_whole_model_and_its_reference_is_the_start(
    tiny_qwen3: Path, request: pytest.FixtureRequest, read: str
) -> None:
    """:class:`HeadTrunk` (the frozen layers once, the top layers twice) gives the full
    forward's scores with the adapter on, the base model's with it off, and the same gradient:
    the label read on a 4-layer Qwen3 (trunk 2), the marker read on the 2-layer SmolLM2-shaped
    model (trunk 1; its tokenizer has the read token)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.ranker.first_token import HeadTrunk, frozen_trunk
    from memsifter.testing.rewards import topic_sessions
    from memsifter.testing.tiny_models import build_tiny_qwen3, marker_head_spec

    if read == "marker":
        from memsifter.coarse.bm25 import BM25Filter

        folder = request.getfixturevalue("tiny_smollm2")
        tok = AutoTokenizer.from_pretrained(folder)
        builder = marker_head_spec(str(folder)).builder(tok, BM25Filter())
        built = [builder.build(q, topic_sessions(n)) for q, n in (("topic 2?", 4), ("t 1?", 7))]
        prompts, ns, cut = [b.text for b in built], [4, 7], 1
    else:
        folder = build_tiny_qwen3(tiny_qwen3.parent / "deep", layers=4)
        tok = AutoTokenizer.from_pretrained(folder)
        prompts = ["a short question <ranking>", "a much longer question " * 6 + "<ranking>"]
        ns, cut = [3, 5], 2
    start = AutoModelForCausalLM.from_pretrained(folder).eval()
    layers = start.config.num_hidden_layers
    model = _lora_top(AutoModelForCausalLM.from_pretrained(folder), layers - cut)
    assert frozen_trunk(model) == cut and frozen_trunk(start) == 0
    full = head_scores(model, tok, prompts, ns, read=read)
    trunk = HeadTrunk(model, tok, prompts, ns, read=read, cut=cut)
    split = trunk.scores()
    real = torch.isfinite(full)
    assert torch.equal(real, torch.isfinite(split))
    assert torch.allclose(full[real], split[real], atol=1e-5)
    with torch.no_grad():
        ref = trunk.scores(adapter=False)
        want = head_scores(start, tok, prompts, ns, read=read)
    assert torch.allclose(ref[real], want[real], atol=1e-5)
    assert not torch.allclose(split[real], ref[real], atol=1e-3)  # the adapter does something
    adapted = [p for p in model.parameters() if p.requires_grad]
    g_full = torch.autograd.grad(full[real].sum(), adapted)
    g_split = torch.autograd.grad(split[real].sum(), adapted)
    for a, b in zip(g_full, g_split, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(RankingHeadError, match=f"between 1 and {layers - 1}"):
        HeadTrunk(model, tok, prompts, ns, read=read, cut=layers)
    with pytest.raises(RankingHeadError, match="needs a PEFT model"):
        HeadTrunk(start, tok, prompts, ns, read=read, cut=1).scores(adapter=False)


def test_eval_and_validation_read_the_head_through_the_proxy(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    """`memsifter eval proxy` and validation score rendered prompts with the head through the
    one answer path: the rankings are the in-process head's, written as generate's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.evaluation.proxy_eval import EvalData, Question, model_run
    from memsifter.llm.transformers_backend import TransformersBackend
    from memsifter.ranker.first_token import ranking_text
    from memsifter.training.validation import ValidationEngine, generate_completions

    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3).eval()
    prompts = [f"question {i} with words " * (i + 1) + "<ranking>" for i in range(3)]
    ns = [3, 5, 4]
    want = [ranking_text(o) for o in rank_prompts(model, tok, prompts, ns)]
    rows = [{"prompt": p, "n_candidates": n} for p, n in zip(prompts, ns, strict=True)]
    engine = ValidationEngine(batch_size=2, ranking_head="first_token")
    assert generate_completions(tiny_qwen3, rows, max_new_tokens=1, engine=engine) == want
    spec = PromptSpec(
        model=str(tiny_qwen3), window_tokens=2048, completion_tokens=0, ask_think=False,
        ranking_head="first_token",
    )  # fmt: skip
    questions = [
        Question(f"q{i}", p, n, tuple(range(n)), (0,))
        for i, (p, n) in enumerate(zip(prompts, ns, strict=True))
    ]
    data = EvalData(tmp_path, "test", spec, questions, 3, 3, {})
    run = model_run("head", str(tiny_qwen3), TransformersBackend(str(tiny_qwen3)), data, 2)
    assert run.completions == want and run.parse_rate == 1.0


def test_group_advantages_follow_grpo_scale_rewards() -> None:
    from memsifter.training.pl_grpo import group_advantages

    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5], [2.0, 0.0, 2.0, 0.0]])
    none = group_advantages(r, "none")
    assert torch.allclose(none.sum(1), torch.zeros(3))
    assert torch.allclose(none[2], torch.tensor([1.0, -1.0, 1.0, -1.0]))
    group = group_advantages(r, "group")
    assert torch.allclose(group[1], torch.zeros(4))  # a flat group teaches nothing
    assert torch.allclose(group[2], none[2] / (r[2].std() + 1e-4))
    assert torch.allclose(group_advantages(r, "batch"), none / (r.std() + 1e-4))
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(r, "median")


@pytest.fixture(scope="module")
def gym_head(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small first-token gym: the tiny proxy, RL data of configs/data/gym_first_token.yaml."""
    from memsifter.testing.gym import gym_rl_data

    root = Path(__file__).resolve().parents[2]
    world = {"seed": 0, "level": "single", "size": "ci", "users": 40}
    built = gym_rl_data(
        tmp_path_factory.mktemp("gym_head"), world, root / "configs/data/gym_first_token.yaml"
    )
    return {**built, "root": root}


def _cfg(gym_head: dict[str, Path], name: str, *extra: str) -> object:
    from memsifter.training.config import load_train_config

    return load_train_config(
        gym_head["root"] / "configs/train/gym_pl_outcome.yaml",
        [
            f"output_dir={gym_head['tmp'] / name}",
            f"data={gym_head['data']}",
            f"model.name={gym_head['proxy']}",
            "grpo.per_device_train_batch_size=32",
            "epochs.validation_max_questions=8",
            *extra,
        ],
    )


def _trainer(gym_head: dict[str, Path], name: str, steps: int, *extra: str) -> Any:
    """A PL-GRPO trainer on the gym's train split with the recipe's reward, ``steps`` long."""
    from datasets import load_dataset

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.pl_grpo import PLGRPOTrainer

    train = load_dataset(
        "parquet", data_files=str(gym_head["data"] / "train.parquet"), split="train"
    )
    cfg = _cfg(gym_head, name, f"epochs.max_steps={steps}", "epochs.save_steps=0", *extra)
    fn = make_reward_function(
        RewardService.from_config(load_reward_config(gym_head["root"] / cfg.reward))
    )
    fn.set_total_steps(steps)
    return PLGRPOTrainer(cfg, str(gym_head["proxy"]), train, fn, Path(cfg.output_dir),
                         log=lambda _: None)  # fmt: skip


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (("sft.enabled=true", "sft.target=random"), "random target teaches labels"),
        (("sft.enabled=true", "sft.target=gold", "sft.target_ids=2"), "one target a prompt"),
        (("grpo.per_device_train_batch_size=30",), "multiple of grpo.num_generations"),
        (("grpo.soft_overlong={cache_tokens: 8}",), "nothing is overlong"),
    ],
)
def test_trl_only_settings_are_refused_by_name(
    gym_head: dict[str, Path], override: tuple[str, ...], message: str
) -> None:
    from memsifter.training.loop import run_training

    with pytest.raises(DataError, match=message):
        run_training(_cfg(gym_head, "refused", *override), log=lambda _: None)


def test_listwise_loss_is_the_cross_entropy_of_a_gold_label_first() -> None:
    import torch

    from memsifter.training.listwise_sft import listwise_loss

    scores = torch.tensor([[2.0, 0.0, -1.0], [1.0, 1.0, float("-inf")]])
    p = torch.softmax(scores, -1)
    # One gold label: FIRST's cross-entropy; two: the probability that either comes first.
    want = -(torch.log(p[0, 1]) + torch.log(p[1, 0] + p[1, 1])) / 2
    assert torch.allclose(listwise_loss(scores, [[1], [0, 1]]), want)
    # A padded place carries no probability: the two real labels of row 1 hold it all.
    assert float(listwise_loss(scores[1:], [[0, 1]])) == pytest.approx(0.0, abs=1e-6)


def test_listwise_rows_take_gold_or_the_coarse_first_and_skip_rows_without_gold() -> None:
    from memsifter.training.listwise_sft import listwise_rows

    rows = [
        {"prompt": "a", "n_candidates": 3, "gold_positions": [2, 0], "coarse_order": [1, 2, 0]},
        {"prompt": "b", "n_candidates": 2, "gold_positions": [], "coarse_order": [1, 0]},
    ]
    gold = listwise_rows(rows, "gold")
    assert [(r["prompt"], r["targets"]) for r in gold] == [("a", [0, 2])]
    coarse = sorted(listwise_rows(rows, "coarse"), key=lambda r: r["prompt"])
    assert [r["targets"] for r in coarse] == [[1], [1]]


def test_resume_continues_the_same_run(gym_head: dict[str, Path]) -> None:
    """Four steps straight and two steps, a restart, two more give the same weights: batches,
    Gumbel draws and the optimiser state are all a function of the step."""
    from datasets import load_dataset

    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.pl_grpo import PLGRPOTrainer

    train = load_dataset(
        "parquet", data_files=str(gym_head["data"] / "train.parquet"), split="train"
    )

    def trainer(name: str, steps: int) -> PLGRPOTrainer:
        cfg = _cfg(gym_head, name, f"epochs.max_steps={steps}", "epochs.save_steps=2")
        fn = make_reward_function(
            RewardService.from_config(load_reward_config(gym_head["root"] / cfg.reward))
        )
        fn.set_total_steps(4)
        return PLGRPOTrainer(cfg, str(gym_head["proxy"]), train, fn, Path(cfg.output_dir),
                             log=lambda _: None)  # fmt: skip

    straight = trainer("straight", 4)
    straight.train()
    first = trainer("resumed", 2)
    first.train()
    again = trainer("resumed", 4)
    again.train(resume_from_checkpoint=str(gym_head["tmp"] / "resumed" / "checkpoint-2"))
    assert again.state.global_step == 4
    assert [e["reward"] for e in again.state.log_history] == [
        e["reward"] for e in straight.state.log_history
    ]
    for a, b in zip(straight.model.parameters(), again.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    moved = any(
        not torch.allclose(a, b)
        for a, b in zip(straight.model.parameters(), first.model.parameters(), strict=True)
    )
    assert moved  # the last two steps changed the model: the comparison is not vacuous


def test_a_first_token_run_trains_validates_and_averages(gym_head: dict[str, Path]) -> None:
    import json

    from memsifter.ranker.checkpoint import read_spec
    from memsifter.training.loop import run_training

    cfg = _cfg(gym_head, "run", "epochs.max_steps=4", "epochs.save_steps=2")
    summary = run_training(cfg, log=lambda _: None)
    epoch = Path(cfg.output_dir) / "epoch-0"
    results = json.loads((epoch / "validation.json").read_text())
    assert {"start", "checkpoint-2", "checkpoint-4"} <= set(results)
    assert all(r["parse_rate"] == 1.0 for r in results.values())  # nothing to parse wrong
    assert read_spec(summary["model"]).ranking_head == "first_token"


def test_a_time_budget_stops_after_a_step_saves_it_and_the_loop_validates_it(
    gym_head: dict[str, Path],
) -> None:
    """epochs.max_minutes: the run planned for 50 steps stops after the first (its budget is a
    few microseconds), saves that step with its log, and validates it as its last."""
    import json

    from memsifter.training.loop import run_training

    cfg = _cfg(
        gym_head, "timed", "epochs.max_steps=50", "epochs.save_steps=0", "epochs.max_minutes=1e-7"
    )
    run_training(cfg, log=lambda _: None)
    epoch = Path(cfg.output_dir) / "epoch-0"
    assert sorted(p.name for p in epoch.glob("checkpoint-*")) == ["checkpoint-1"]
    state = json.loads((epoch / "checkpoint-1" / "trainer_state.json").read_text())
    assert state["global_step"] == 1
    assert state["log_history"][-1]["stopped"] == "max_minutes"
    assert "checkpoint-1" in json.loads((epoch / "validation.json").read_text())


def test_a_non_finite_gradient_is_skipped_and_logged_and_three_in_a_row_stop_the_run(
    gym_head: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NaN gradient is never applied (clipping would spread it to every weight): the step is
    skipped and logged, and a run that keeps skipping stops by name."""
    t = _trainer(gym_head, "nonfinite", 6)
    before = [p.detach().clone() for p in t.model.parameters() if p.requires_grad]
    real = torch.nn.utils.clip_grad_norm_

    def nan_norm(params: Any, max_norm: float) -> Any:
        real(params, max_norm)
        return torch.tensor(float("nan"))

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", nan_norm)
    with pytest.raises(MemSifterError, match="3 steps in a row ended with a non-finite gradient"):
        t.train()
    assert [e.get("nonfinite_grad_skipped") for e in t.state.log_history] == [1, 1, 1]
    after = [p for p in t.model.parameters() if p.requires_grad]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # With finite norms the same trainer's steps do move the weights (the check can fail).
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", real)
    t.max_steps = t.state.global_step + 1
    t.train()
    assert "nonfinite_grad_skipped" not in t.state.log_history[-1]
    moved = [p for p in t.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, moved, strict=True))


def test_beta_adds_the_first_place_kl_to_the_start(gym_head: dict[str, Path]) -> None:
    """With beta > 0 the trainer keeps a frozen copy of the start as the KL reference: after
    training the policy's head scores have moved and the reference's have not."""
    t = _trainer(gym_head, "kl", 3, "grpo.beta=0.5")
    assert t.ref is not None and not any(p.requires_grad for p in t.ref.parameters())
    assert t.trunk == 0  # a full fine-tune: the reference is a frozen copy
    t.train()
    rows = t._batch(0)
    with torch.no_grad():
        ns = [int(r["n_candidates"]) for r in rows]
        now = head_scores(t.model, t.tok, [r["prompt"] for r in rows], ns)
        start = head_scores(t.ref, t.tok, [r["prompt"] for r in rows], ns)
    assert not torch.allclose(now, start)  # the policy moved; the reference did not follow


@pytest.mark.parametrize("top_layers", [1, 2], ids=["top-layer", "every-layer"])
def test_under_lora_the_kl_reference_is_the_adapter_off(
    gym_head: dict[str, Path], top_layers: int
) -> None:
    """LoRA on the 2-layer gym proxy: no copy of the model is kept. On the top layer the trunk
    below the adapter is shared; on every layer (no frozen trunk) the reference is the policy's
    forward with the adapter off. The KL is logged, growing from 0 as the policy moves (a
    reference that followed the policy would keep it at 0)."""
    t = _trainer(
        gym_head, f"kl-lora-{top_layers}", 3, "grpo.beta=0.5", "grpo.learning_rate=0.05",
        "model.lora.r=4", f"model.lora.top_layers={top_layers}", "model.lora.dropout=0.0",
        "model.lora.target_modules=[q_proj,v_proj]",
    )  # fmt: skip
    assert t.ref is None and t.trunk == 2 - top_layers
    t.train()
    kls = [e["kl"] for e in t.state.log_history if "kl" in e]
    assert len(kls) == 3 and abs(kls[0]) < 1e-6 and kls[-1] > 1e-6


def test_the_service_ranks_with_the_head_and_says_what_the_label_cap_cut(
    tiny_qwen3: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/v1/rank through the head (in process): 12 candidates for 10 single-token labels; the
    coarse filter keeps its best 10 for the prompt, the response counts both, and the two it
    cut follow the model's ranking."""
    from fastapi.testclient import TestClient

    from memsifter.coarse import build_filter
    from memsifter.llm.transformers_backend import TransformersBackend
    from memsifter.serving.app import create_app
    from memsifter.serving.config import ApiKeySettings, PagingSettings, ServeConfig
    from memsifter.serving.ranking import ServiceRanker

    monkeypatch.setenv("MEMSIFTER_TEST_HEAD_KEY", "key-head-tests-0123456789")
    spec = PromptSpec(
        model=str(tiny_qwen3), window_tokens=4096, completion_tokens=0, ask_think=False,
        ranking_head="first_token",
    )  # fmt: skip
    ranker = ServiceRanker(
        build_filter("bm25"), TransformersBackend(str(tiny_qwen3)), spec, max_candidates=12
    )
    config = ServeConfig(
        db_url=f"sqlite:///{tmp_path / 'head.db'}",
        paging=PagingSettings(turns_per_page=2),
        api_keys=[ApiKeySettings(tenant="acme", key_env="MEMSIFTER_TEST_HEAD_KEY")],
    )
    sessions = [
        {"id": f"s{i}", "date": f"2024-05-{i + 1:02d}T10:00:00",
         "turns": [{"speaker": "user", "text": f"note {i} about topic {i % 4}"}]}
        for i in range(12)
    ]  # fmt: skip
    headers = {"Authorization": "Bearer key-head-tests-0123456789"}
    with TestClient(create_app(config, ranker), headers=headers) as c:
        r = c.post("/v1/rank", json={"question": "what about topic 3?", "sessions": sessions})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ranker"].startswith("proxy:") and body["parse"]["status"] == "ok"
    assert (body["parse"]["shown"], body["parse"]["cut_by_coarse"]) == (10, 2)
    assert body["parse"]["n_from_model"] == 10
    assert sorted(i["id"] for i in body["ranking"]) == sorted(s["id"] for s in sessions)


def test_a_checkpoint_served_with_the_other_head_is_refused_naming_both(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    import shutil

    from memsifter.ranker.checkpoint import PromptSpecError, resolve_spec, save_spec

    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_qwen3, folder)
    save_spec(PromptSpec(model=str(tiny_qwen3), ask_think=False), folder)  # trained: generate
    with pytest.raises(
        PromptSpecError, match=r"ranking_head: 'first_token' \(the model's spec: 'generate'\)"
    ):
        resolve_spec(str(folder), {"ranking_head": "first_token"})


def test_autocast_bf16_trains_the_head_in_bf16_with_fp32_weights(
    gym_head: dict[str, Path],
) -> None:
    """model.autocast: bf16 runs the head trainer's forward in bf16 (its scores differ from
    fp32 ones by bf16 rounding, not more), keeps the weights fp32, and trains."""
    t = _trainer(gym_head, "bf16", 2, "model.autocast=bf16")
    rows = t._batch(0)
    prompts, ns = [r["prompt"] for r in rows], [int(r["n_candidates"]) for r in rows]
    with torch.no_grad():
        fp32 = head_scores(t.model, t.tok, prompts, ns)
        with t.autocast():
            bf16 = head_scores(t.model, t.tok, prompts, ns)
    real = torch.isfinite(fp32)
    assert bf16.dtype == torch.float32 and not torch.equal(bf16[real], fp32[real])
    assert torch.allclose(bf16[real], fp32[real], atol=0.5)
    before = [p.detach().clone() for p in t.model.parameters() if p.requires_grad]
    t.train()
    after = [p for p in t.model.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before, strict=True))


PL_OPTION = {"pl_advantage": "best_of_group", "pl_credit": "tiers"}


def test_head_only_options_are_refused_where_they_mean_nothing(gym_head: dict[str, Path]) -> None:
    from memsifter.training.config import ModelSettings, load_train_config
    from memsifter.training.grpo import check_head_only

    with pytest.raises(ValueError, match="model.autocast"):
        ModelSettings(autocast="fp8")
    # The TRL trainer's precision is model.dtype: an autocast there would be a silent no-op.
    cfg = load_train_config(
        gym_head["root"] / "configs/train/gym_outcome.yaml",
        [f"output_dir={gym_head['tmp'] / 'trl'}", "model.autocast=bf16"],
    )
    with pytest.raises(DataError, match="first-token trainers' option"):
        check_head_only(cfg, head=False)
    check_head_only(cfg, head=True)  # the head's trainers honour it
    cfg.model.autocast = "none"
    check_head_only(cfg, head=False)
    for setting in ("pl_advantage", "pl_credit"):
        head_only = dataclasses.replace(
            cfg, grpo=dataclasses.replace(cfg.grpo, **{setting: PL_OPTION[setting]})
        )
        with pytest.raises(DataError, match=f"grpo.{setting}"):
            check_head_only(head_only, head=False)
        check_head_only(head_only, head=True)
