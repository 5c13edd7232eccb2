"""What the head's trainer does with the launch it is given (memsifter.training.sharding): one
process never shards; FSDP2 shards; DeepSpeed, FSDP1 and parameter offload are refused by name
before any model loads. The sharded update itself is tested against one process in
tests/training/test_pl_grpo_distributed.py."""

from __future__ import annotations

import pytest

from memsifter.errors import DataError
from memsifter.training.sharding import PREFIX, adapter_into, check_launch, optimizer_state_for

FSDP2 = {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "false"}


def _env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED", "FSDP_VERSION",
                 "FSDP_OFFLOAD_PARAMS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in values.items():
        monkeypatch.setenv(name, value)


def test_fsdp2_shards_and_one_process_or_ddp_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, **FSDP2)
    assert check_launch(distributed=True)
    assert not check_launch(distributed=False)  # one process holds the model
    _env(monkeypatch)
    assert not check_launch(distributed=True)  # DDP


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed's engine would own"),
        ({**FSDP2, "FSDP_VERSION": "1"}, "fsdp_version 1"),
        ({"ACCELERATE_USE_FSDP": "true"}, "fsdp_version 1"),  # accelerate's default
        ({**FSDP2, "FSDP_OFFLOAD_PARAMS": "true"}, "fsdp_offload_params: false"),
    ],
)
def test_what_it_cannot_do_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    _env(monkeypatch, **env)
    with pytest.raises(DataError, match=named):
        check_launch(distributed=True)


def test_a_saved_adapter_lands_under_the_model_names() -> None:
    state = {
        "base_model.model.layers.0.q_proj.lora_A.default.weight": 0,
        "base_model.model.layers.0.q_proj.base_layer.weight": 1,
    }
    adapter_into(state, {"base_model.model.layers.0.q_proj.lora_A.weight": 7}, "default")
    assert state["base_model.model.layers.0.q_proj.lora_A.default.weight"] == 7
    with pytest.raises(DataError, match="no place for"):
        adapter_into(state, {"base_model.model.layers.9.q_proj.lora_A.weight": 7}, "default")


def test_an_optimizer_state_is_read_in_the_form_this_run_loads() -> None:
    """Torch's own state (by position, an unsharded run's) and a sharded run's gathered state (by
    name) convert into each other, tensors untouched; a state of other parameters, or of more
    groups, is refused by name."""
    names = ["layers.0.w", "layers.1.w", "head.w"]
    m0, m2 = object(), object()
    positional = {
        "state": {0: {"exp_avg": m0}, 2: {"exp_avg": m2}},  # parameter 1 never had a gradient
        "param_groups": [{"lr": 1e-3, "params": [0, 1, 2]}],
    }
    by_name = optimizer_state_for(positional, names, True, "ckpt")
    assert by_name["state"] == {
        PREFIX + "layers.0.w": {"exp_avg": m0},
        PREFIX + "head.w": {"exp_avg": m2},
    }
    assert by_name["param_groups"] == [{"lr": 1e-3, "params": [PREFIX + n for n in names]}]
    back = optimizer_state_for(by_name, names, False, "ckpt")
    assert back == positional and back["state"][0]["exp_avg"] is m0
    # Already in this run's form: as saved.
    assert optimizer_state_for(positional, names, False, "ckpt") == positional
    assert optimizer_state_for(by_name, names, True, "ckpt") == by_name
    with pytest.raises(DataError, match=r"holds 3 parameters and this run trains 2 \(not there: "):
        optimizer_state_for(by_name, ["layers.0.w", "other.w"], False, "ckpt")
    with pytest.raises(DataError, match="holds 3 parameters and this run trains 4"):
        optimizer_state_for(positional, [*names, "extra.w"], True, "ckpt")
    two_groups = {**positional, "param_groups": positional["param_groups"] * 2}
    with pytest.raises(DataError, match="2 parameter groups"):
        optimizer_state_for(two_groups, names, False, "ckpt")
