"""The coarse opinion as a feature (spec ``coarse_weight``): the prior's values, the spec's
rules, an untrained head that ranks as the coarse filter does once the prior outweighs it (and,
the control, does not without it), the service's prior taking the coarse order's place, and both
trainers' policies reading the fused scores."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from memsifter.ranker.coarse_prior import fuse, fuse_tensor, prior
from memsifter.ranker.first_token import RankingHeadError
from memsifter.ranker.spec import PromptSpec


def test_the_prior_is_minus_log_one_plus_the_coarse_rank() -> None:
    assert prior([2, 0, 1], 3) == pytest.approx([-math.log(2), -math.log(3), 0.0])
    # A candidate the order leaves out ranks after every one it lists.
    assert prior([1], 3) == pytest.approx([-math.log(2), 0.0, -math.log(2)])
    for bad in ([0, 0, 1], [0, 3]):
        with pytest.raises(RankingHeadError, match="not a ranking of 3 candidates"):
            prior(bad, 3)


def test_fuse_adds_the_weighted_prior_or_refuses_without_an_order() -> None:
    assert fuse([1.0, 2.0], None, 0.0) == [1.0, 2.0]
    assert fuse([1.0, 2.0], [0, 1], 2.0) == pytest.approx([1.0, 2.0 - 2 * math.log(2)])
    assert fuse([5.0], None, 3.0) == [5.0]  # one candidate: nothing to order
    with pytest.raises(RankingHeadError, match="coarse_weight: 3.0.*without one"):
        fuse([1.0, 2.0], None, 3.0)
    import torch

    scores = torch.tensor([[1.0, 2.0, float("-inf")], [0.0, 0.0, 0.0]])
    fused = fuse_tensor(scores, [[1, 0], [2, 1, 0]], [2, 3], 1.0)
    assert fused[0, :2].tolist() == pytest.approx([1.0 - math.log(2), 2.0])
    assert fused[0, 2] == float("-inf")
    assert fused[1].tolist() == pytest.approx([-math.log(3), -math.log(2), 0.0])
    with pytest.raises(RankingHeadError, match="carry no coarse_order"):
        fuse_tensor(scores, None, [2, 3], 1.0)


def test_the_spec_keeps_the_weight_only_when_set_and_only_for_the_head() -> None:
    head = {"ranking_head": "first_token", "ask_think": False}
    assert "coarse_weight" not in PromptSpec(**head).to_dict()
    spec = PromptSpec(coarse_weight=4.0, **head)
    assert spec.to_dict()["coarse_weight"] == 4.0
    assert PromptSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="needs ranking_head: first_token"):
        PromptSpec(coarse_weight=1.0)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite number >= 0"):
            PromptSpec(coarse_weight=bad, **head)


# --------------------------------------------------------------------------- a real head


@pytest.fixture(scope="module")
def fused_gym(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The gym's first-token data rendered twice for the tiny gym proxy: plain, and fused with
    a prior far above the untrained head's score spread."""
    from memsifter.testing.gym import gym_rl_data

    root = Path(__file__).resolve().parents[2]
    world = {"seed": 0, "level": "single", "size": "ci", "users": 12}
    recipe = root / "configs/data/gym_first_token.yaml"
    tmp = tmp_path_factory.mktemp("fused_gym")
    plain = gym_rl_data(tmp / "plain", world, recipe)
    fused = gym_rl_data(tmp / "fused", world, recipe, prompt={"coarse_weight": 1000.0})
    return {"root": root, "plain": plain["data"], "fused": fused["data"], "proxy": plain["proxy"]}


def _rows(folder: Path) -> list[dict[str, Any]]:
    from memsifter.training.rldata.build import load_rl_dataset

    return [dict(r) for r in load_rl_dataset(folder)["validation"]][:12]


def _answers(proxy_path: Path, folder: Path) -> list[list[int]]:
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.ranker.proxy import Proxy, RenderedPrompt

    proxy = Proxy.from_pretrained(proxy_path, prompt=read_spec(folder))
    rows = _rows(folder)
    prompts = [
        RenderedPrompt(r["prompt"], int(r["n_candidates"]), tuple(r["coarse_order"])) for r in rows
    ]
    return [list(a.parsed.ids) for a in proxy.answer(prompts)]


def test_an_untrained_fused_head_ranks_as_the_coarse_filter_and_the_plain_one_does_not(
    fused_gym: dict[str, Path],
) -> None:
    rows = _rows(fused_gym["fused"])
    coarse = [[int(p) for p in r["coarse_order"]] for r in rows]
    assert all(len(c) == int(r["n_candidates"]) for c, r in zip(coarse, rows, strict=True))
    assert _answers(fused_gym["proxy"], fused_gym["fused"]) == coarse
    # The control: the same untrained head without the prior ranks by its own scores.
    plain = _answers(fused_gym["proxy"], fused_gym["plain"])
    assert [r["prompt"] for r in _rows(fused_gym["plain"])] == [r["prompt"] for r in rows]
    assert sum(p != c for p, c in zip(plain, coarse, strict=True)) >= len(rows) // 2


def test_the_service_prior_is_the_coarse_opinion_a_fused_head_reads(
    fused_gym: dict[str, Path],
) -> None:
    from memsifter.ranker.checkpoint import read_spec
    from memsifter.ranker.proxy import Proxy
    from memsifter.testing.rewards import fact_sessions

    proxy = Proxy.from_pretrained(fused_gym["proxy"], prompt=read_spec(fused_gym["fused"]))
    sessions = fact_sessions(4)
    prior_ids = [s.id for s in reversed(sessions)]
    got = proxy.rank("what did I say about the fact?", sessions, prior=prior_ids)
    assert list(got.ranking.ids) == prior_ids
    # Without a prior, the builder's own coarse ranking (it ranks every prompt for the prior).
    again = proxy.rank("what did I say about the fact?", sessions)
    assert again.prompt.coarse_order is not None
    assert list(again.parsed.ids) == list(again.prompt.coarse_order)


def test_both_trainers_draw_from_the_fused_scores(
    fused_gym: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from datasets import load_dataset

    import memsifter.training.listwise_sft as listwise
    import memsifter.training.pl_grpo as pl
    from memsifter.rewards import load_reward_config
    from memsifter.rewards.service import RewardService
    from memsifter.rewards.trl import make_reward_function
    from memsifter.training.config import load_train_config

    calls: list[tuple[float, list[list[int]] | None]] = []

    def spy(scores: Any, orders: Any, ns: Any, weight: float) -> Any:
        calls.append((weight, orders))
        return fuse_tensor(scores, orders, ns, weight)

    monkeypatch.setattr(pl, "fuse_tensor", spy)
    monkeypatch.setattr(listwise, "fuse_tensor", spy)
    root, data = fused_gym["root"], fused_gym["fused"]
    tmp = data.parent / "runs"
    cfg = load_train_config(
        root / "configs/train/gym_pl_outcome.yaml",
        [
            f"output_dir={tmp / 'pl'}",
            f"data={data}",
            f"model.name={fused_gym['proxy']}",
            "grpo.per_device_train_batch_size=16",
            "epochs.max_steps=1",
            "epochs.save_steps=0",
        ],
    )
    train = load_dataset("parquet", data_files=str(data / "train.parquet"), split="train")
    fn = make_reward_function(RewardService.from_config(load_reward_config(root / cfg.reward)))
    fn.set_total_steps(1)
    trainer = pl.PLGRPOTrainer(
        cfg, str(fused_gym["proxy"]), train, fn, Path(cfg.output_dir), log=lambda _: None
    )
    trainer._step(0)
    orders = {tuple(r["coarse_order"]) for r in train}
    assert calls and all(w == 1000.0 and o is not None for w, o in calls)
    assert all(tuple(order) in orders for _w, o in calls for order in o)  # the rows' own

    # The cold start: one step of the listwise cross-entropy over the fused scores.
    calls.clear()
    sft_cfg = load_train_config(
        root / "configs/train/gym_pl_outcome.yaml",
        [
            f"output_dir={tmp / 'sft'}",
            f"data={data}",
            f"model.name={fused_gym['proxy']}",
            "sft.enabled=true",
            "sft.target=gold",
            "sft.max_examples=4",
            "sft.per_device_train_batch_size=2",
        ],
    )
    listwise.run_listwise_sft(
        sft_cfg, str(fused_gym["proxy"]), train, tmp / "sft", log=lambda _: None
    )
    assert calls and all(w == 1000.0 and o is not None for w, o in calls)
    assert all(tuple(order) in orders for _w, o in calls for order in o)


def test_a_fused_checkpoint_on_unfused_data_is_refused_naming_the_weight() -> None:
    from memsifter.ranker.checkpoint import spec_differences

    head = {"ranking_head": "first_token", "ask_think": False}
    diff = spec_differences(PromptSpec(coarse_weight=2.0, **head), PromptSpec(**head))
    assert diff == {"coarse_weight": (2.0, 0.0)}
