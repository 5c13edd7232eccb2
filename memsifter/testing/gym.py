"""The memory gym's tiny proxy: a random Qwen3 whose tokenizer is trained on the gym's grammar.

The learnability benchmark and its CI test need a proxy that starts knowing nothing (so that what
it learns of relevance comes from the reward) and that is cheap on two cores. The tokenizer is
trained on every sentence the grammar can write, the questions and the proxy prompt's own
instructions, so a word is mostly one token and a gym prompt of nine sessions stays near 600
tokens; ids are single digits as in Qwen's own tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from memsifter.data.gym_grammar import (
    _ACKS,
    _CLOSERS,
    _FILLERS,
    _GREETINGS,
    _SMALL_TALK,
    ASSISTANT,
    ATTRIBUTES,
    KNOWLEDGE,
    NAMES,
    RELATIONS,
)
from memsifter.testing.tiny_models import build_tiny_qwen3


def gym_corpus() -> tuple[str, ...]:
    """Every template with every value, the fixed phrases, and the proxy prompt's text."""
    from memsifter.ranker.messages import _TEXT

    lines: list[str] = []
    for a in ATTRIBUTES:
        vals = a.values
        for i, v in enumerate(vals):
            prev = vals[(i + 1) % len(vals)]
            rel = RELATIONS[i % len(RELATIONS)]
            lines += [
                a.first.format(value=v),
                a.change.format(prev=prev, value=v),
                a.former.format(value=v),
                a.other.format(rel=rel, value=v),
                a.earlier_q.format(value=v),
            ]
        lines += [a.current_q, *a.chitchat]
    lines += [q for q, _ in KNOWLEDGE] + [ans for _, ans in KNOWLEDGE]
    lines += [*_GREETINGS, *_ACKS, *_FILLERS, *_CLOSERS, *_SMALL_TALK]
    lines += [f"{n}: hello" for n in (*NAMES, ASSISTANT)]
    lines += [t for t in _TEXT["en"].values()]
    months = "January February March April May June July August September October November December"
    lines += [f"[Session {i}] Date: {i + 1:02d} {m} 2023" for i, m in enumerate(months.split())]
    lines += ["<ranking>3, 0, 8, 1, 7, 2, 6, 4, 5</ranking>"]
    return tuple(lines)


def read_corpus() -> tuple[str, ...]:
    """:func:`gym_corpus` plus the reading level's templates, values and questions, and the
    letter labels (``[Session A]`` … ``[Session z]``) the head ranks a whole window with. A
    separate corpus, so the older levels' proxy (and its committed results) keep their
    tokenizer."""
    import string

    from memsifter.data.gym_read_grammar import corpus

    letters = string.ascii_uppercase + string.ascii_lowercase
    # Each label is scored as space + letter; repeated so that BPE merges every such pair into
    # one token (once each, a 1,200-piece vocabulary merges only the common ones).
    labels = [f"[Session {c}] Date: 01 May 2024 <ranking> {c}, {c}" for c in letters] * 40
    return (*gym_corpus(), *corpus(), *labels)


ARCHS = ("gpt2", "qwen3")


def build_gym_proxy(
    out_dir: Path,
    seed: int = 0,
    *,
    arch: str = "qwen3",
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    corpus: Sequence[str] | None = None,
) -> Path:
    """A tiny random proxy for the gym, with the gym-trained tokenizer (Qwen's tokenizer class
    and chat template) either way: ``qwen3`` (the default) is ``build_tiny_qwen3`` with the gym
    corpus; ``gpt2`` has learned absolute position embeddings instead of RoPE.

    Ranking means naming a session's *position*, so the network must carry a session's id to
    its content before it can point at it. Supervised on the useful session, two layers of
    width 128 leave chance after ~150 steps of 16 prompts (``eval/probes/gym_pointer_probe.py``,
    ``eval/results/gym_pointer_probe/gym_pointer_probe.md``). Deeper models and the nine-candidate
    world stayed at chance in this session's uncommitted exploratory runs: rerun the probe before
    relying on either. ``corpus`` trains the tokenizer (default :func:`gym_corpus`; the reading
    level's worlds take :func:`read_corpus`)."""
    corpus = tuple(corpus) if corpus is not None else gym_corpus()
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    out_dir = Path(out_dir)
    if arch == "qwen3":
        return build_tiny_qwen3(
            out_dir,
            seed,
            corpus=corpus,
            vocab_size=1200,
            hidden_size=hidden_size,
            layers=layers,
            heads=heads,
            kv_heads=max(1, heads // 2),
        )
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    from memsifter.testing.tiny_models import _train_qwen_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = _train_qwen_tokenizer(out_dir, vocab_size=1200, corpus=corpus)
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    config = GPT2Config(
        vocab_size=len(tok),
        n_embd=hidden_size,
        n_layer=layers,
        n_head=heads,
        n_positions=4096,
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False
    )
    model.save_pretrained(str(out_dir))
    return out_dir


def gym_rl_data(
    out: Path,
    world: dict[str, object],
    recipe: str | Path,
    corpus: Sequence[str] | None = None,
    prompt: dict[str, object] | None = None,
) -> dict[str, Path]:
    """A gym world (``GymConfig`` fields), the tiny proxy and the RL data of ``recipe`` rendered
    for that proxy on that world, all under ``out``: the setup of the gym's learning tests.
    ``prompt``: fields of the recipe's prompt spec to change (a layout, a head read)."""
    import dataclasses

    import yaml

    from memsifter.training.rldata.build import load_rl_data_config, prepare_rl_data

    out.mkdir(parents=True, exist_ok=True)
    world_file = out / "world.yaml"
    world_file.write_text(yaml.safe_dump(dict(world)), encoding="utf-8")
    proxy = build_gym_proxy(out / "proxy", corpus=corpus)
    cfg = load_rl_data_config(recipe)
    cfg = dataclasses.replace(
        cfg,
        prompt=dataclasses.replace(cfg.prompt, model=str(proxy), **dict(prompt or {})),
        sources=[dataclasses.replace(s, path=str(world_file)) for s in cfg.sources],
    )
    prepare_rl_data(cfg, out / "data")
    return {"tmp": out, "proxy": proxy, "data": out / "data"}
