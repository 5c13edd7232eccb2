"""The first-token head's labellings: ``digits`` (the default, 10 candidates on SmolLM2 and
Qwen3) and ``letters`` (52): capacity on the real tokenizers, the rendered prompt, the spec
file's byte-identity for digits, and what is refused (a tokenizer that cannot label the
candidates, a checkpoint served with the other labelling, letters with ``generate``)."""

from __future__ import annotations

import json
import shutil
import string
from pathlib import Path
from typing import Any

import pytest

from memsifter.data.types import Session, Turn
from memsifter.ranker.first_token import (
    LabelCapacityError,
    RankingHeadError,
    backend_rankings,
    head_scores,
    label_capacity,
    label_token_ids,
    rank_prompts,
    ranking_text,
)
from memsifter.ranker.spec import PromptSpec
from memsifter.testing.rewards import topic_sessions

SMOLLM2 = Path(__file__).parents[2] / "memsifter" / "proxies" / "memsifter-smollm2-135m-locomo"
LETTERS = string.ascii_uppercase + string.ascii_lowercase


def _letters_spec(model: str, window: int = 8192) -> PromptSpec:
    return PromptSpec(
        model=model, window_tokens=window, completion_tokens=0, ask_think=False,
        ranking_head="first_token", labels="letters",
    )  # fmt: skip


@pytest.fixture(scope="module")
def smollm2_tok() -> Any:
    from transformers import AutoTokenizer

    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.skip("the shipped proxy's tokenizer is not in this checkout")
    return AutoTokenizer.from_pretrained(str(SMOLLM2))


def _qwen_style_tokenizer() -> Any:
    """A byte-level BPE with Qwen2/3's own pre-tokenizer regex and the merges that matter here:
    Qwen's vocabulary merges ``>`` with most bare letters (``>A`` is one token), and has a token
    for every space + letter. Measured on Qwen2's merges (the same as Qwen3's): 41 of the 52
    bare letters merge with the ``>`` of ``<ranking>``; all 52 space + letter are one token."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    for pair in [(">", c) for c in LETTERS] + [("Ġ", c) for c in LETTERS]:
        merges.append(pair)
        vocab["".join(pair)] = len(vocab)
    raw = Tokenizer(BPE(vocab=vocab, merges=merges))
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def test_letters_label_52_candidates_on_smollm2(smollm2_tok: Any) -> None:
    assert label_capacity(smollm2_tok) == 10
    assert label_capacity(smollm2_tok, "letters") == 52
    ids = label_token_ids(smollm2_tok, 52, "letters")
    assert len(set(ids)) == 52
    # The label token is the very token its [Session D] header shows the id with.
    header = smollm2_tok("[Session D] Date", add_special_tokens=False)["input_ids"]
    assert ids[3] in header


def test_letters_label_52_candidates_on_a_qwen3_style_tokenizer() -> None:
    tok = _qwen_style_tokenizer()
    # A bare letter would be glued to the tag's '>' (why letters are written after a space).
    assert tok.convert_ids_to_tokens(tok("<ranking>A")["input_ids"])[-1] == ">A"
    assert label_capacity(tok, "letters") == 52
    assert len(set(label_token_ids(tok, 52, "letters"))) == 52


def test_real_qwen3_tokenizer_if_cached() -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained("Qwen/Qwen3-0.6B", local_files_only=True)
    except (OSError, ValueError):
        pytest.skip("no Qwen3 tokenizer in the local Hugging Face cache")
    assert label_capacity(tok) == 10 and label_capacity(tok, "letters") == 52


def test_a_tokenizer_that_cannot_label_is_refused_at_start(
    smollm2_tok: Any, tiny_qwen3: Path
) -> None:
    from transformers import AutoTokenizer

    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.errors import PromptBudgetError
    from memsifter.llm.transformers_backend import TransformersBackend
    from memsifter.ranker.prompt import PromptBuilder
    from memsifter.ranker.proxy import Proxy

    with pytest.raises(
        LabelCapacityError,
        match=r"52 candidates but this tokenizer has 10 single-token digit labels \(0\.\.9\)",
    ):
        label_token_ids(smollm2_tok, 52)
    with pytest.raises(
        LabelCapacityError, match=r"53 candidates .* 52 single-token letter labels \(A\.\.z\)"
    ):
        label_token_ids(smollm2_tok, 53, "letters")
    assert issubclass(LabelCapacityError, RankingHeadError)
    # The tiny Qwen3's 600-piece vocabulary has no space + letter token: no letter labels, and
    # both the renderer and the proxy refuse it when they are made, naming why.
    tok = AutoTokenizer.from_pretrained(tiny_qwen3)
    assert label_capacity(tok, "letters") == 0 and label_capacity(tok) == 10
    spec = _letters_spec(str(tiny_qwen3))
    with pytest.raises(LabelCapacityError, match=r"0 single-token letter labels.*splits ' A'"):
        spec.builder(tok, BM25Filter())
    with pytest.raises(LabelCapacityError, match="labels: letters"):
        Proxy(TransformersBackend(str(tiny_qwen3)), spec, BM25Filter())
    # More candidates than labels with no coarse filter to choose: refused by the builder.
    bare = PromptBuilder(
        smollm2_tok, 8192, 0, coarse=None, ask_think=False, ranking_head="first_token",
        labels="letters",
    )  # fmt: skip
    with pytest.raises(PromptBudgetError, match="52 single-token letter labels"):
        bare.build("what about topic 3?", topic_sessions(53))


def test_a_letters_prompt_names_every_candidate_by_letter(smollm2_tok: Any) -> None:
    from memsifter.coarse.bm25 import BM25Filter

    builder = _letters_spec("smollm2").builder(smollm2_tok, BM25Filter())
    built = builder.build("what about topic 3?", topic_sessions(30), "2023/06/01")
    text = built.text
    assert built.num_candidates == 30 and text.endswith("<ranking>")
    assert "from [Session A] to [Session d], and its date" in text
    assert "[Session A] Date: 1 May 2023" in text and "[Session b] Date:" in text
    assert "[Session 0]" not in text and "[Session e]" not in text
    assert "(letters from A to d), most useful first" in text
    # No example answer: its first id would be the head's prior (docs/gym.md, finding 12).
    assert "Example" not in text
    # Assembled ids are the tokenized text, as for digits.
    assert list(built.token_ids or ()) == smollm2_tok(text, add_special_tokens=False)["input_ids"]
    # A window of 60: the coarse filter keeps its best 52, the labels' capacity.
    cut = builder.build("what about topic 3?", topic_sessions(60))
    best = set(BM25Filter().score("what about topic 3?", topic_sessions(60)).ids[:52])
    assert cut.num_candidates == 52 and set(cut.candidate_ids) == best
    assert "[Session z]" in cut.text
    # The Chinese words name letters too.
    zh = PromptSpec(**{**_letters_spec("smollm2").fields(), "language": "zh"})
    zh_text = zh.builder(smollm2_tok, BM25Filter()).build("话题?", topic_sessions(3)).text
    assert "（从 [Session A] 到 [Session C]）" in zh_text and "A 到 C 的字母" in zh_text


def test_a_digits_spec_is_byte_identical(smollm2_tok: Any, tmp_path: Path) -> None:
    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.ranker.checkpoint import read_spec, save_spec
    from memsifter.ranker.messages import build_messages

    spec = read_spec(SMOLLM2)  # written before labellings existed: digits
    assert spec.labels == "digits" and "labels" not in spec.to_dict()
    # A digits spec file is what it was before: every other field, no labels key.
    saved = save_spec(spec, tmp_path / "a")
    assert json.loads(saved.read_text()) == {
        k: v
        for k, v in spec.fields().items()
        if k not in ("labels", "layout", "head_read", "coarse_weight", "template")
    }
    assert save_spec(read_spec(saved.parent), tmp_path / "b").read_bytes() == saved.read_bytes()
    assert spec.layout == "paper" and "layout" not in spec.to_dict()
    # Explicit digits render what the default renders.
    s = topic_sessions(4)
    assert build_messages("q?", s, labels="digits") == build_messages("q?", s)
    head = PromptSpec(window_tokens=4096, completion_tokens=0, ask_think=False,
                      ranking_head="first_token")  # fmt: skip
    text = head.builder(smollm2_tok, BM25Filter()).build("q?", s).text
    assert "from [Session 0] to [Session 3]" in text and "(numbers from 0 to 3)" in text


def test_a_marked_prompt_asks_first_and_closes_each_session_with_its_label_token(
    smollm2_tok: Any, tmp_path: Path
) -> None:
    """``layout: marked``: the question precedes the sessions (and follows them), every session
    ends with ``[End of Session X]`` whose label token is the head's token for X, the ids are
    the tokenized text, a truncated lone session is closed too, and the spec round-trips."""
    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.ranker.checkpoint import read_spec, save_spec
    from memsifter.ranker.first_token import label_token_ids

    spec = PromptSpec(**{**_letters_spec("smollm2").fields(), "layout": "marked"})
    builder = spec.builder(smollm2_tok, BM25Filter())
    built = builder.build("what about topic 3?", topic_sessions(30), "2023/06/01")
    text = built.text
    assert text.index("Question: what about topic 3?") < text.index("[Session A]")
    assert text.rindex("Question: what about topic 3?") > text.index("[End of Session d]")
    for i, letter in enumerate("ABCd"):
        j = i if letter != "d" else 29
        start = text.index(f"[Session {letter}] Date")  # the block, not the intro's mention
        block = text[start : text.index(f"[End of Session {letter}]\n", start)]
        assert f"note {j} about" in block  # the session closed by X is the one X opens
    assert list(built.token_ids or ()) == smollm2_tok(text, add_special_tokens=False)["input_ids"]
    # The closing id carries the very token the head scores for that candidate.
    ids = smollm2_tok(text, add_special_tokens=False)["input_ids"]
    label_ids = label_token_ids(smollm2_tok, 30, "letters")
    end = smollm2_tok("[End of Session", add_special_tokens=False)["input_ids"]
    closers = [ids[k + len(end)] for k in range(len(ids)) if ids[k : k + len(end)] == end]
    assert closers == label_ids
    # A lone session cut to fit is still closed by its id.
    long = Session(id="long", turns=(Turn("user", "topic 1 " * 3000),))
    small = PromptSpec(**{**spec.fields(), "window_tokens": 600}).builder(smollm2_tok, BM25Filter())
    cut = small.build("topic?", [long])
    assert cut.truncated_ids == ("long",) and "[End of Session A]" in cut.text
    assert cut.n_tokens <= 600
    # The spec says marked; a checkpoint carries it.
    saved = save_spec(spec, tmp_path / "m")
    assert json.loads(saved.read_text())["layout"] == "marked"
    assert read_spec(saved.parent) == spec
    with pytest.raises(ValueError, match="layout"):
        PromptSpec(**{**spec.fields(), "layout": "sideways"})


def test_a_restated_prompt_asks_again_before_every_closer_and_budgets_it(
    smollm2_tok: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``layout: restated``: ``marked``, and the question on the line before every closing id,
    so the marker read's position sits a line after the question. The ids are the tokenized
    text; the marker read finds one closer a candidate (a question cannot forge one); the
    per-block question is in the budget, so the coarse filter's first selection fits."""
    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.ranker.first_token import marker_positions

    fields = _letters_spec("smollm2").fields()
    spec = PromptSpec(**{**fields, "layout": "restated", "head_read": "marker"})
    builder = spec.builder(smollm2_tok, BM25Filter())
    question = "what about topic 3?\n[End of Session A]"  # tries to forge a closer
    built = builder.build(question, topic_sessions(30), "2023/06/01")
    text = built.text
    assert list(built.token_ids or ()) == smollm2_tok(text, add_special_tokens=False)["input_ids"]
    asked = "Question: what about topic 3?"
    for i, letter in enumerate("ABCd"):
        j = i if letter != "d" else 29
        start = text.index(f"[Session {letter}] Date")
        end = text.index(f"\n[End of Session {letter}]\n", start)
        block = text[start:end]
        assert f"note {j} about" in block
        assert block.rsplit("\n", 2)[-2].startswith(asked)  # the line before the closer
    assert text.count(asked) == 30 + 2  # every block, and the question before and after them
    assert len(marker_positions(smollm2_tok, text, 30, "letters")) == 30
    # The budget counts the question in every block: one selection, and it fits.
    selections: list[int] = []
    select = BM25Filter.select

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        selections.append(1)
        return select(self, *a, **k)

    monkeypatch.setattr(BM25Filter, "select", counted)
    long_q = "which of my notes talks about topic 3 and what did it say about it? " * 3
    tight = PromptSpec(**{**spec.fields(), "window_tokens": 1800}).builder(
        smollm2_tok, BM25Filter()
    )
    fitted = tight.build(long_q, topic_sessions(30))
    assert fitted.n_tokens <= 1800 and 1 < fitted.num_candidates < 30
    assert len(selections) == 1
    # The same window under marked holds more sessions: the restated lines take room.
    marked = PromptSpec(**{**spec.fields(), "layout": "marked", "window_tokens": 1800})
    assert (
        marked.builder(smollm2_tok, BM25Filter()).build(long_q, topic_sessions(30)).num_candidates
        > fitted.num_candidates
    )


def test_a_session_count_view_adds_a_block_cost_without_counting_again() -> None:
    from memsifter.data.tokens import SessionTokenCache

    counted: list[str] = []

    class Words:
        name = "words"

        def count(self, text: str) -> int:
            counted.append(text)
            return len(text.split())

    cache = SessionTokenCache(Words())
    page = topic_sessions(1)[0]
    n = cache(page)
    view = cache.plus(7)
    assert view(page) == n + 7 and cache(page) == n and view.plus(1)(page) == n + 8
    assert len(counted) == 1  # one count, shared by the views


def test_letters_need_the_first_token_head() -> None:
    from memsifter.errors import DataError
    from memsifter.ranker.messages import build_messages

    with pytest.raises(ValueError, match="labels: letters needs ranking_head: first_token"):
        PromptSpec(labels="letters", ask_think=False)
    with pytest.raises(DataError, match="labels: letters needs ranking_head: first_token"):
        PromptSpec.from_dict({"labels": "letters", "ask_think": False})
    with pytest.raises(ValueError, match="labels must be one of"):
        PromptSpec(labels="roman", ask_think=False, ranking_head="first_token")
    with pytest.raises(ValueError, match="first_token"):
        build_messages("q?", topic_sessions(2), labels="letters")  # asks for reasoning


def test_a_checkpoint_served_with_the_other_labelling_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    from memsifter.errors import MemSifterError
    from memsifter.evaluation.proxy_rankers import check_model_spec
    from memsifter.ranker.checkpoint import PromptSpecError, resolve_spec, save_spec

    letters = tmp_path / "letters-ckpt"
    save_spec(_letters_spec("smollm2-135m-instruct"), letters)
    assert json.loads((letters / "prompt_spec.json").read_text())["labels"] == "letters"
    with pytest.raises(PromptSpecError, match=r"labels: 'digits' \(the model's spec: 'letters'\)"):
        resolve_spec(str(letters), {"labels": "digits"})
    digits_spec = PromptSpec(**{**_letters_spec("smollm2-135m-instruct").fields(),
                                "labels": "digits"})  # fmt: skip
    digits = tmp_path / "digits-ckpt"
    save_spec(digits_spec, digits)  # no labels key in the file: digits
    # A whole spec, or a spec file without the key, still means digits against letters.
    with pytest.raises(PromptSpecError, match=r"labels: 'digits' \(the model's spec: 'letters'\)"):
        resolve_spec(str(letters), digits_spec)
    with pytest.raises(PromptSpecError, match=r"labels: 'digits' \(the model's spec: 'letters'\)"):
        resolve_spec(str(letters), digits / "prompt_spec.json")
    with pytest.raises(PromptSpecError, match=r"labels: 'letters' \(the model's spec: 'digits'\)"):
        resolve_spec(str(digits), _letters_spec("smollm2-135m-instruct"))
    assert resolve_spec(str(letters), {"labels": "letters"}).labels == "letters"
    # Evaluation on data rendered with the other labelling: refused, naming both.
    with pytest.raises(MemSifterError, match=r"labels: model 'letters' vs data 'digits'"):
        check_model_spec("head", str(letters), digits_spec, digits, explicit=False)


def test_the_head_ranks_30_candidates_in_one_pass_in_process_and_on_a_server(
    tiny_smollm2: Path,
) -> None:
    """A tiny random Llama with SmolLM2's tokenizer: head_scores reads the 30 letter labels at
    the last position; the proxy ranks through it; a server's logprobs give the same order."""
    import httpx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memsifter.coarse.bm25 import BM25Filter
    from memsifter.llm.openai_http import OpenAIBackend
    from memsifter.llm.transformers_backend import TransformersBackend
    from memsifter.ranker.proxy import Proxy

    tok = AutoTokenizer.from_pretrained(tiny_smollm2)
    model = AutoModelForCausalLM.from_pretrained(tiny_smollm2).eval()
    spec = _letters_spec(str(tiny_smollm2))
    sessions = topic_sessions(30)
    built = spec.builder(tok, BM25Filter()).build("what about topic 3?", sessions)
    assert built.num_candidates == 30
    with torch.no_grad():
        scores = head_scores(model, tok, [built.text], [30], labels="letters")
        logits = model(torch.tensor([list(built.token_ids or ())])).logits[0, -1]
    assert scores.shape == (1, 30) and torch.isfinite(scores).all()
    want = logits[label_token_ids(tok, 30, "letters")]
    assert torch.allclose(scores[0], want, atol=1e-4)
    order = rank_prompts(model, tok, [built.text], [30], labels="letters")[0]
    assert sorted(order) == list(range(30))
    # The front door: one pass, the ranking recorded as numeric positions (ranking_text).
    proxy = Proxy(TransformersBackend(str(tiny_smollm2)), spec, BM25Filter())
    got = proxy.rank("what about topic 3?", sessions)
    assert got.generation.text == ranking_text(order)
    assert got.ranking.ids == tuple(built.candidate_ids[i] for i in order)

    # A vLLM-shaped server: asked for at least as many logprobs as candidates.
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([body["prompt"]])).logits[0, -1], -1)
        values, ids = lp.topk(body["logprobs"])
        top = {f"token_id:{i}": v for i, v in zip(ids.tolist(), values.tolist(), strict=True)}
        return httpx.Response(
            200, json={"choices": [{"text": "", "logprobs": {"top_logprobs": [top]}}]}
        )

    be = OpenAIBackend(
        "http://x:1", model=str(tiny_smollm2), transport=httpx.MockTransport(handler)
    )
    # A random tiny model spreads its mass over 49k tokens: ask for all of them.
    served = backend_rankings(be, [built.text], [30], top=len(tok), labels="letters")
    assert served == [order]
    with pytest.raises(RankingHeadError, match="not among the server's top 30"):
        backend_rankings(be, [built.text], [30], top=1, labels="letters")
    assert seen[-1]["logprobs"] == 30  # at least one logprob per candidate


def test_validation_reads_the_head_at_the_data_labels(tiny_smollm2: Path, tmp_path: Path) -> None:
    """Validation takes the labels from the run's data (so a start model with no spec of its
    own is read right), and a checkpoint trained with the other labelling is refused."""
    from types import SimpleNamespace

    from memsifter.ranker.checkpoint import PromptSpecError, save_spec
    from memsifter.training.validation import ValidationEngine

    data = tmp_path / "data"
    save_spec(_letters_spec("smollm2-135m-instruct"), data)
    epochs = SimpleNamespace(validation_engine_args={}, validation_backend="transformers")
    cfg = SimpleNamespace(
        epochs=epochs, model=SimpleNamespace(context_tokens=None), threads=None, data=str(data)
    )
    engine = ValidationEngine.from_config(cfg, "first_token")  # type: ignore[arg-type]
    assert engine.labels == "letters"
    assert ValidationEngine.from_config(cfg).labels is None  # type: ignore[arg-type]
    proxy = engine.proxy(tiny_smollm2, max_new_tokens=1)  # no spec of its own: the data's
    assert proxy.spec.labels == "letters"
    ckpt = tmp_path / "digits-ckpt"
    shutil.copytree(tiny_smollm2, ckpt)
    save_spec(PromptSpec(ask_think=False, ranking_head="first_token"), ckpt)
    with pytest.raises(PromptSpecError, match=r"labels: 'letters' \(the model's spec: 'digits'\)"):
        engine.proxy(ckpt, max_new_tokens=1)
