"""Tiny random models shaped like the hub models MemSifter loads, built offline in seconds.

Tests cannot download ``BAAI/bge-m3`` (2.2 GB, and there is no hub access), but they should still
exercise the real loading and encoding code. ``build_tiny_bge_m3`` writes a folder with the same
layout as the hub repo: an XLM-RoBERTa encoder, an XLM-R-style Unigram tokenizer trained here on
a few built-in sentences, and the ``colbert_linear.pt`` / ``sparse_linear.pt`` heads. The heads
matter: FlagEmbedding initialises them randomly when they are missing, which would make sparse
scores differ between runs. Everything is seeded, so two builds write byte-identical files.

``build_tiny_qwen3`` does the same for the proxy: a 2-layer ``Qwen3ForCausalLM`` with a byte-level
BPE tokenizer in Qwen's own tokenizer class, ChatML special tokens, a chat template with Qwen3's
``enable_thinking`` switch, and ``<think>``/``<ranking>`` tags as ordinary added tokens, so the
prompt, generation and parsing code runs exactly as it would against ``Qwen/Qwen3-4B``.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

from memsifter.ranker.spec import PromptSpec

# English plus Chinese because BGE-M3 is multilingual and our data (LoCoMo, LongMemEval plus the
# Chinese splits) mixes both; the tokenizer should split either into real pieces, not <unk>.
_CORPUS = (
    "I adopted a golden retriever named Max last spring.",
    "My sister is getting married in Lisbon next June.",
    "We talked about my new job as a nurse at the city hospital.",
    "I have been learning to play the violin for three years.",
    "The marathon in Berlin was the hardest race I ever ran.",
    "Can you recommend a vegetarian recipe for dinner tonight?",
    "My favourite book is a novel about a lighthouse keeper.",
    "I moved from Chicago to Seattle because of the rain and the coffee.",
    "Yesterday I painted a sunset over the lake with watercolours.",
    "Remind me when my passport expires; I think it is in October.",
    "She said the support group meeting helped her a lot.",
    "Our team won the chess tournament on Saturday afternoon.",
    "What did I tell you about my grandmother's garden?",
    "I bought a used bicycle and rode it to work every day.",
    "The concert was loud, but the band played my favourite song.",
    "我上个月去北京旅游，看了长城和故宫。",
    "我的猫叫小白，它很喜欢睡觉。",
    "明天我要去医院看望我的奶奶。",
    "我们周末一起去爬山吧，天气应该很好。",
    "她最近在学习弹钢琴，每天练习一个小时。",
    "我换了新工作，现在是一名软件工程师。",
    "你还记得我上次说的那本书吗？",
    "今年夏天我们全家去海边度假。",
)
_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # XLM-R's ids 0..4; <unk> must be 3
_MAX_LENGTH = 8192  # BGE-M3's window; position ids start after <pad> (id 1), hence the +2 below


def _train_tokenizer(out_dir: Path, vocab_size: int) -> int:
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import Unigram
    from tokenizers.trainers import UnigramTrainer
    from transformers import XLMRobertaTokenizer

    raw = Tokenizer(Unigram())
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL_TOKENS),
        unk_token="<unk>",
        # Cover all of ASCII so English test text never collapses into <unk>.
        initial_alphabet=list(string.ascii_letters + string.digits + string.punctuation),
        max_piece_length=8,
        show_progress=False,
    )
    raw.train_from_iterator(_CORPUS, trainer=trainer)

    trained = [(piece, float(score)) for piece, score in json.loads(raw.to_str())["model"]["vocab"]]
    n_special = len(_SPECIAL_TOKENS)
    if tuple(piece for piece, _ in trained[:n_special]) != _SPECIAL_TOKENS:
        raise RuntimeError(f"unexpected special-token order in the trained vocab: {trained[:5]}")
    vocab = trained[:n_special] + _canonical_order(trained[n_special:])
    # Wrapping the trained pieces in transformers' own XLM-R class gives the same pre-tokenizer,
    # post-processor (<s> ... </s>) and special-token map as the real BGE-M3 tokenizer.
    tokenizer = XLMRobertaTokenizer(vocab=vocab, model_max_length=_MAX_LENGTH)
    tokenizer.save_pretrained(str(out_dir))
    return len(vocab)


def _canonical_order(pieces: list[tuple[str, float]]) -> list[tuple[str, float]]:
    """Give the trained pieces ids that do not depend on the run.

    The trainer learns the same pieces every run, but its EM sums differ in the last bits, and
    characters it keeps only for coverage get scores ``min - k * 1e-4`` in hash-set order. Either
    would shuffle ids between builds, and with them the embedding rows. Pieces whose scores form
    a chain with gaps under 1e-3 therefore share one score and are ordered by text; the gaps
    between chains are far larger than the noise, so the grouping itself is stable.
    """
    groups: list[list[tuple[str, float]]] = []
    for piece, score in sorted(pieces, key=lambda item: -item[1]):
        if groups and groups[-1][-1][1] - score < 1e-3:
            groups[-1].append((piece, score))
        else:
            groups.append([(piece, score)])
    ordered: list[tuple[str, float]] = []
    for group in groups:
        shared = round(group[0][1], 4)
        ordered.extend((piece, shared) for piece in sorted(piece for piece, _ in group))
    return ordered


def build_tiny_bge_m3(out_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random BGE-M3-shaped model folder to ``out_dir`` and return it.

    Loadable by ``FlagEmbedding.BGEM3FlagModel`` and ``AutoTokenizer``/``AutoModel``; the
    scores are meaningless but deterministic for a given ``seed``.
    """
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel
    from transformers.utils import logging as hf_logging

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = _train_tokenizer(out_dir, vocab_size=400)

    config = XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=_MAX_LENGTH + 2,
        type_vocab_size=1,
        bos_token_id=0,
        pad_token_id=1,
        eos_token_id=2,
        # With the usual 0.02 init every [CLS] vector comes out nearly identical (cosine ~1.0),
        # so rankings would hinge on float noise; a wide init makes texts actually differ.
        initializer_range=0.5,
    )
    # A private generator would not reach transformers' weight init, which draws from the
    # global RNG; fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = XLMRobertaModel(config).eval()
        hidden = config.hidden_size
        colbert_linear = torch.nn.Linear(hidden, hidden)
        sparse_linear = torch.nn.Linear(hidden, 1)
    previous_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a "Writing model shards" bar per build is only noise
    try:
        model.save_pretrained(str(out_dir))
    finally:
        if previous_bars:
            hf_logging.enable_progress_bar()
    torch.save(colbert_linear.state_dict(), out_dir / "colbert_linear.pt")
    torch.save(sparse_linear.state_dict(), out_dir / "sparse_linear.pt")
    return out_dir


# Qwen keeps <think> and </think> as added but *non-special* tokens: decoding with
# skip_special_tokens=True must leave them (and our <ranking> tags) in the text the parser reads.
_CHAT_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TAG_TOKENS = ("<think>", "</think>", "<ranking>", "</ranking>")
# Words of the ranking prompt, so prompts in tests tokenize into pieces rather than bytes.
_CHAT_CORPUS = _CORPUS + (
    "[Session 0] Date: 8 May, 2023",
    "Rank the sessions by how useful they are for answering the question.",
    "Question date: 2023/05/20. Question: Where did I travel last month?",
    "<think>The question asks about a trip.</think><ranking>3, 0, 12, 7</ranking>",
    "请根据问题对会话进行排序，最有用的排在前面。",
)
# ChatML as Qwen3 renders it, minus tool calls: with enable_thinking=false the generation prompt
# carries an empty think block, otherwise the model is left to open <think> itself.
_QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
_QWEN3_MAX_LENGTH = 32768


def _train_qwen_tokenizer(
    out_dir: Path, vocab_size: int, corpus: tuple[str, ...] = _CHAT_CORPUS
) -> Any:
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers import AddedToken
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX, Qwen2Tokenizer

    # Train with the very normalizer and pre-tokenizer Qwen2Tokenizer rebuilds on load, so the
    # learned merges are the ones it will apply.
    raw = Tokenizer(BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    # Unlike the Unigram trainer, BPE breaks count ties by pair ids, and the 256-byte initial
    # alphabet fixes those ids, so merges and vocab come out the same in every process.
    trainer = BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(raw.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    # Ids after the BPE pieces in a fixed order, as in Qwen's own vocab; Qwen2Tokenizer would
    # otherwise append eos and pad in its own order.
    for token in _CHAT_SPECIAL_TOKENS + _TAG_TOKENS:
        vocab[token] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]

    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=_QWEN3_MAX_LENGTH,
    )
    tokenizer.add_tokens([AddedToken(t, special=True) for t in _CHAT_SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in _TAG_TOKENS])
    tokenizer.chat_template = _QWEN3_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer


def build_tiny_qwen3(
    out_dir: Path,
    seed: int = 0,
    *,
    corpus: tuple[str, ...] | None = None,
    vocab_size: int = 600,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,
    kv_heads: int = 1,
    extra_corpus: tuple[str, ...] = (),
) -> Path:
    """Write a tiny random Qwen3-shaped causal LM folder to ``out_dir`` and return it.

    Loadable by ``AutoModelForCausalLM``/``AutoTokenizer``; ``generate`` stops at ``<|im_end|>``.
    Its output is gibberish but deterministic for a given ``seed``. ``corpus`` trains the
    tokenizer instead of the built-in sentences (the memory gym trains it on its own grammar,
    so that a word is a token and prompts stay short); ``extra_corpus`` adds to it (a word
    that must be one token, such as the marker read's ``" yes"``); the sizes shape the network.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_qwen_tokenizer(
        out_dir,
        vocab_size=vocab_size,
        corpus=(_CHAT_CORPUS if corpus is None else corpus) + extra_corpus,
    )
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=32,
        max_position_embeddings=_QWEN3_MAX_LENGTH,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=True,
        bos_token_id=pad_id,  # Qwen's config names <|endoftext|> as bos, though it never adds it
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).eval()
    # Greedy by default so that tests which generate get the same text every run.
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=False
    )
    previous_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out_dir))
    finally:
        if previous_bars:
            hf_logging.enable_progress_bar()
    return out_dir


def build_tiny_smollm2(out_dir: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write a tiny random Llama (SmolLM2's architecture) with SmolLM2's own tokenizer, copied
    from ``tokenizer_dir`` (the shipped proxy adapter holds one), to ``out_dir``.

    For llama.cpp: its converter recognises a BPE tokenizer only by the hash of how it splits a
    fixed text, so a tokenizer trained here would be refused, while SmolLM2's is known. 2 layers
    of width 64, ~3.3M parameters (nearly all the 49,152-token embedding); greedy generation stops
    at ``<|im_end|>``. Weights are drawn with a wide init so the next-token logits are peaked:
    two engines' float sums then pick the same greedy token almost always.
    """
    import shutil

    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copyfile(Path(tokenizer_dir) / name, out_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    bos_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 100_000.0},
        tie_word_embeddings=True,
        initializer_range=0.5,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=eos_id, do_sample=False
    )
    previous_bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out_dir))
    finally:
        if previous_bars:
            hf_logging.enable_progress_bar()
    return out_dir


def marker_head_spec(model: str, labels: str = "digits", layout: str = "marked") -> PromptSpec:
    """A first-token head spec with the marker read (``head_read: marker``) on ``model``: marked
    layout (or ``restated``), no think, a window wide enough for the tests' prompts."""
    return PromptSpec(
        model=model, window_tokens=8192, completion_tokens=0, ask_think=False,
        ranking_head="first_token", labels=labels, layout=layout, head_read="marker",
    )  # fmt: skip
