"""What the head's trainer does with the launch it is given (memsifter.training.sharding): one
process never shards; FSDP2 shards; DeepSpeed, FSDP1 and parameter offload are refused by name
before any model loads. The sharded update itself is tested against one process in
tests/training/test_pl_grpo_distributed.py."""

from __future__ import annotations

import pytest

from memsifter.errors import DataError
from memsifter.training.sharding import adapter_into, check_launch

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
