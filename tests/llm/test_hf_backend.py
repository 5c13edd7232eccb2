"""The transformers backend on the tiny Qwen3: batched, left-padded greedy generation must give
exactly what one-at-a-time generation gives, in the caller's order."""

from __future__ import annotations

from pathlib import Path

import pytest

from memsifter.llm import BackendSpec, SamplingParams, build_backend


@pytest.fixture(scope="module")
def backend(tiny_qwen3: Path):
    return build_backend(
        BackendSpec(kind="transformers", model=str(tiny_qwen3), batch_size=4, threads=2)
    )


def _prompts(backend) -> list[str]:
    tok = backend.tokenizer
    qs = ["hi", "tell me about the marathon I ran in May please", "猫叫什么名字？", "rank these"]
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in qs
    ]


def test_batched_equals_single_greedy(backend) -> None:
    prompts = _prompts(backend)
    sampling = SamplingParams(max_new_tokens=12)
    batched = backend.generate(prompts, sampling)
    single = [backend.generate([p], sampling)[0] for p in prompts]
    assert [g[0].text for g in batched] == [g[0].text for g in single]
    for gens, p in zip(batched, prompts, strict=True):
        g = gens[0]
        assert g.prompt_tokens == len(backend.tokenizer(p, add_special_tokens=False)["input_ids"])
        assert 0 < g.completion_tokens <= 12
        assert g.finish_reason in ("stop", "length")


def test_sampling_n_and_seed(backend) -> None:
    prompts = _prompts(backend)[:2]
    s = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=7)
    a = backend.generate(prompts, s)
    b = backend.generate(prompts, s)
    assert [len(g) for g in a] == [3, 3]
    assert [[x.text for x in g] for g in a] == [[x.text for x in g] for g in b]


def test_cpu_bf16_units_read_the_flags(tmp_path: Path) -> None:
    from memsifter.machine import cpu_bf16_units, cpu_flags

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f amx_bf16 avx512_bf16\n")
    assert cpu_bf16_units(cpu_flags(info)) == ("amx_bf16", "avx512_bf16")
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert cpu_bf16_units(cpu_flags(info)) == ()
    assert cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.parametrize("units", [(), ("amx_bf16",)])
def test_bf16_without_cpu_units_is_kept_but_said(
    tiny_qwen3: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    units: tuple[str, ...],
) -> None:
    """The config's dtype is what runs (chosen, never inferred); a CPU that would emulate bf16
    gets one warning naming the cost and the fix, and one with bf16 units gets none."""
    import torch

    import memsifter.llm.transformers_backend as tb

    monkeypatch.setattr(tb, "cpu_bf16_units", lambda: units)
    with caplog.at_level("WARNING", logger=tb.__name__):
        backend = build_backend(
            BackendSpec(kind="transformers", model=str(tiny_qwen3), dtype="bfloat16")
        )
    assert next(backend.model.parameters()).dtype == torch.bfloat16
    said = [r.getMessage() for r in caplog.records if "without bf16 units" in r.getMessage()]
    if units:
        assert said == []
    else:
        assert len(said) == 1 and "set the dtype to float32" in said[0]
