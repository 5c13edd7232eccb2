"""The first-token ranking head: a ranking read from one position's logits, and its
Plackett–Luce policy.

The prompt ends right after ``<ranking>``; the logits at that one position, restricted to the
candidates' labels (``0``, ``1``, … or ``A``, ``B``, … by the spec's ``labels``; each a single
token of the tokenizer), are the candidates' scores. Sorting them is the greedy ranking
(FIRST's single-token decoding); as a policy they define a Plackett–Luce distribution over
permutations, sampled without replacement by Gumbel top-k. Training (the PL-GRPO trainer),
validation and serving all read the head from here, at the labels of the data's spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from memsifter.errors import MemSifterError
from memsifter.ranker.messages import (
    CLOSER_OPEN,
    answer_label,
    candidate_label,
    check_labelling,
    labelling_size,
)
from memsifter.ranker.parse import RANKING_OPEN


class RankingHeadError(MemSifterError, ValueError):
    """A tokenizer whose candidate labels are not single tokens, or a bad head request."""


HEAD_READS: tuple[str, ...] = ("label", "marker")
# The token whose logit is a candidate's score under ``read: marker``, at the last token of the
# candidate's closing marker. Any fixed token would do (training moves its logit); a common
# word keeps it one token on every tokenizer the project serves.
MARKER_TOKEN = " yes"


class LabelCapacityError(RankingHeadError):
    """More candidates than the tokenizer has single-token labels in the spec's labelling."""


def _label_ids(tokenizer: Any, labels: str, n: int) -> tuple[list[int], str | None]:
    """The ids of the first labels that are one token each as they follow ``<ranking>`` (the
    position the head reads) and distinct, up to ``n``; and why the next one is not, if one
    failed. Probed in context: a tokenizer may merge a label with the tag before it."""
    size = labelling_size(labels)
    n = n if size is None else min(n, size)
    if n < 1:
        return [], None
    strings = [answer_label(i, labels) for i in range(n)]
    tag = tokenizer(RANKING_OPEN, add_special_tokens=False)["input_ids"]
    tagged = tokenizer([RANKING_OPEN + s for s in strings], add_special_tokens=False)["input_ids"]
    ids: list[int] = []
    for s, toks in zip(strings, tagged, strict=True):
        if toks[: len(tag)] != tag:
            return ids, f"merges {s!r} with the {RANKING_OPEN} before it ({toks})"
        label = toks[len(tag) :]
        if len(label) != 1:
            return ids, f"splits {s!r} into {len(label)} tokens ({label})"
        if label[0] in ids:
            return ids, f"gives {s!r} the token of {strings[ids.index(label[0])]!r}"
        ids.append(label[0])
    return ids, None


def _labels_named(labels: str, count: int) -> str:
    kind = "digit" if labels == "digits" else "letter"
    span = f" ({candidate_label(0, labels)}..{candidate_label(count - 1, labels)})" if count else ""
    return f"{count} single-token {kind} labels{span}"


def label_token_ids(tokenizer: Any, n: int, labels: str = "digits") -> list[int]:
    """The token id of each candidate label (``labels``: ``digits`` ``0`` … ``n-1``, or
    ``letters`` ``A`` …) as it follows ``<ranking>``. Refuses a tokenizer that cannot label
    ``n`` candidates (:class:`LabelCapacityError`): the head scores one position, one token a
    label."""
    check_labelling(labels)
    if n < 1:
        raise RankingHeadError(f"the ranking head needs at least one candidate, got {n}")
    ids, why = _label_ids(tokenizer, labels, n)
    if len(ids) < n:
        if labels == "digits":
            more = "use labels: letters (52 single-token labels on SmolLM2 and Qwen3)"
        elif ids:
            more = f"lower the candidate count to {len(ids)}"
        else:
            more = "use labels: digits, or a tokenizer with a token for each space + letter"
        reason = f": the tokenizer {why}" if why else ""
        raise LabelCapacityError(
            f"ranking_head: first_token: {n} candidates but this tokenizer has "
            f"{_labels_named(labels, len(ids))} (labels: {labels}){reason}; {more}"
        )
    return ids


def label_capacity(tokenizer: Any, labels: str = "digits", limit: int = 100) -> int:
    """How many candidates the head can label on this tokenizer: the labels (``0``, ``1``, …
    or ``A``, ``B``, …) that are distinct single tokens after ``<ranking>``, counted up to the
    first that is not (Qwen3 and SmolLM2 split numbers into digits: 10 digits; 52 letters)."""
    check_labelling(labels)
    return len(_label_ids(tokenizer, labels, limit)[0])


def check_label_capacity(tokenizer: Any, n: int, labels: str = "digits") -> None:
    """Refuse, before any prompt is built, a setting that asks for ``n`` candidates a prompt
    when the tokenizer labels fewer (:class:`LabelCapacityError` names both)."""
    label_token_ids(tokenizer, n, labels)


def gumbel_topk(
    scores: Any,
    samples: int,
    k: int | None = None,
    temperature: float = 1.0,
    generator: Any = None,
    noise: Any = None,
) -> Any:
    """``samples`` rankings (of length ``k``, default all) per row of ``scores`` ``[B, n]``,
    drawn without replacement from the Plackett–Luce policy ``softmax(scores / temperature)``:
    the top-k of Gumbel-perturbed scores is an exact PL sample. Returns ``[B, samples, k]``
    long. ``-inf`` scores (padding candidates) are never drawn before real ones. ``noise``
    (uniform, ``[B, samples, >= n]``) replaces the draw from ``generator``: a trainer that
    splits one batch over processes draws it once for the whole batch, so a row's rankings do
    not depend on where it landed."""
    import torch

    if temperature <= 0:
        raise RankingHeadError(f"temperature must be > 0, got {temperature}")
    b, n = scores.shape
    k = n if k is None else min(k, n)
    if noise is None:
        u = torch.rand((b, samples, n), generator=generator, dtype=torch.float32)
    else:
        if tuple(noise.shape[:2]) != (b, samples) or noise.shape[2] < n:
            raise RankingHeadError(
                f"noise of shape {tuple(noise.shape)} for {b} rows x {samples} samples x {n}"
            )
        u = noise[:, :, :n]
    gumbel = -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))
    z = scores.detach().float().unsqueeze(1) / temperature + gumbel.to(scores.device)
    return z.topk(k, dim=-1).indices


def pl_log_prob(scores: Any, rankings: Any, temperature: float = 1.0) -> Any:
    """log PL(σ) of each ranking ``[B, G, k]`` under ``softmax(scores / temperature)`` ``[B, n]``:
    sum over places of (the chosen score − logsumexp of the scores not yet placed). A prefix
    ranking (k < n) is the probability of that top-k. Differentiable in ``scores``; the
    per-place terms are :func:`pl_place_log_probs`."""
    return pl_place_log_probs(scores, rankings, temperature).sum(-1)


def ranking_text(order: Sequence[int]) -> str:
    """The completion a ranking stands for, exactly what ``generate`` mode would write: the
    reward service and the parser read it unchanged. Positions stay numeric whatever the
    prompt's labels: this text is an internal record of positions (what rewards, eval and
    serving map back to session ids), never shown to the model, so one format serves both
    labellings and every reward and parser stays as it is."""
    return f"<ranking>{', '.join(str(int(i)) for i in order)}</ranking>"


def marker_token_id(tokenizer: Any) -> int:
    """The id of :data:`MARKER_TOKEN`, refused by name where it is not one token."""
    ids = tokenizer(MARKER_TOKEN, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise RankingHeadError(
            f"head_read: marker reads the logit of {MARKER_TOKEN!r}, which this tokenizer "
            f"splits into {len(ids)} tokens ({ids})"
        )
    return int(ids[0])


def marker_positions(tokenizer: Any, prompt: str, n: int, labels: str = "digits") -> list[int]:
    """The token index (in ``prompt``'s own tokens, no special tokens added) of the last token
    of each candidate's closing marker ``[End of Session D]``, in candidate order: where
    ``read: marker`` scores a candidate. A closer is the marker alone on its line; the builder
    breaks the marker's text anywhere else (a session cannot forge one), so a prompt whose
    closers are not exactly the n labels in order was not rendered with ``layout: marked``
    and is refused by name."""
    return _marker_read(tokenizer, prompt, n, labels)[0]


def _marker_read(tokenizer: Any, prompt: str, n: int, labels: str) -> tuple[list[int], list[int]]:
    """:func:`marker_positions` and the prompt's token ids they index (one tokenization)."""
    import bisect
    import re

    found = list(re.finditer(rf"\n{re.escape(CLOSER_OPEN)} ([^\]\n]+)\]", prompt))
    want = [candidate_label(i, labels) for i in range(n)]
    got = [m.group(1) for m in found]
    if got != want:
        shown = ", ".join(got[:4]) + (", …" if len(got) > 4 else "")
        raise RankingHeadError(
            f"head_read: marker needs one closing marker a candidate, in order: {n} candidates "
            f"({want[0]}..{want[-1]}) but the prompt closes {len(got)} ({shown}); render it "
            "with layout: marked (or restated) and the same labels"
        )
    enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
    starts = [a for a, _ in enc["offset_mapping"]]
    where = [bisect.bisect_right(starts, m.end() - 1) - 1 for m in found]
    return where, list(enc["input_ids"])


def _decoder_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack (its output normed) and the output embedding of a causal LM, a PEFT
    wrapper's included: the marker read needs hidden states at many positions and one row of
    the LM head, never the full vocabulary's logits at every position."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder(), base.get_output_embeddings()


def decoder_layers(model: Any) -> Any:
    """The decoder's layer list (a PEFT wrapper's included): the units FSDP shards."""
    return _decoder_and_head(model)[0].layers


@dataclass
class _Batch:
    """Rendered prompts encoded for the head: right-padded ids, mask and positions, and where
    each row's scores are read."""

    ids: Any
    mask: Any
    pos: Any
    n_candidates: list[int]
    read: str
    read_id: int | None = None  # the marker read's token
    label_ids: Any = None  # the label read's token ids
    last: Any = None  # each row's last prompt token, where the label read reads
    row: Any = None  # the marker read's (row, column, place) of every candidate
    col: Any = None
    place: Any = None


def _encode(
    tokenizer: Any, prompts: Sequence[str], n_candidates: Sequence[int], labels: str, read: str
) -> _Batch:
    import torch

    if len(prompts) != len(n_candidates):
        raise RankingHeadError(f"{len(prompts)} prompts for {len(n_candidates)} candidate counts")
    bad = [i for i, p in enumerate(prompts) if not str(p).rstrip().endswith("<ranking>")]
    if bad:
        raise RankingHeadError(
            f"prompt {bad[0]} does not end with <ranking>: it was not rendered with "
            "ranking_head: first_token (rebuild the data with that prompt spec)"
        )
    if read not in HEAD_READS:
        raise RankingHeadError(f"head read must be one of {HEAD_READS}, got {read!r}")
    width_n = max(n_candidates)
    enc = tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
    width = max(map(len, enc))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(enc), width), pad, dtype=torch.long)
    mask = torch.zeros((len(enc), width), dtype=torch.long)
    # Right-padded: every query then attends to at least its own row's tokens. A left pad's
    # query attends to nothing, and a fully masked row is where fused attention kernels give
    # NaN (four GPU runs' gradients went NaN on one batch; docs/gym.md, finding 19). Nothing
    # is generated, so nothing needs the prompts to end together.
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.tensor(e)
        mask[i, : len(e)] = 1
    batch = _Batch(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), list(n_candidates), read)
    batch.last = mask.sum(-1) - 1
    if read == "marker":
        where = [
            marker_positions(tokenizer, p, n, labels)
            for p, n in zip(prompts, n_candidates, strict=True)
        ]
        batch.read_id = marker_token_id(tokenizer)
        batch.row = torch.tensor([i for i, w in enumerate(where) for _ in w])
        batch.col = torch.tensor([p for w in where for p in w])
        batch.place = torch.tensor([j for w in where for j in range(len(w))])
    else:
        batch.label_ids = torch.tensor(label_token_ids(tokenizer, width_n, labels))
    return batch


def _forward_scores(model: Any, batch: _Batch, inputs_embeds: Any = None) -> Any:
    """The head's scores ``[B, max n]`` from the model's forward over ``batch`` (or over
    ``inputs_embeds``, the hidden states entering the layers the model holds now)."""
    import torch

    device = next(model.parameters()).device
    feed = (
        {"input_ids": batch.ids.to(device)}
        if inputs_embeds is None
        else {"inputs_embeds": inputs_embeds}
    )
    # No KV cache: one forward, and a cache would hold every layer's keys for nothing.
    common = {
        "attention_mask": batch.mask.to(device),
        "position_ids": batch.pos.to(device),
        "use_cache": False,
    }
    width_n = max(batch.n_candidates)
    decoder, lm_head = _decoder_and_head(model)
    hidden = decoder(**feed, **common).last_hidden_state

    def logits(at: Any, ids: Any) -> Any:
        """The LM head's rows ``ids`` against the hidden states ``at``: those tokens' logits,
        without the whole vocabulary's (under autocast the product comes back in bf16)."""
        out = (at @ lm_head.weight[ids].T).float()
        bias = getattr(lm_head, "bias", None)
        return out if bias is None else out + bias[ids].float()

    if batch.read == "marker":
        # The read token's logit at each candidate's closing marker.
        row = batch.row.to(device)
        logit = logits(hidden[row, batch.col.to(device)], [batch.read_id])[:, 0]
        scores = torch.full((len(batch.ids), width_n), float("-inf"), device=device)
        return scores.index_put((row, batch.place.to(device)), logit)
    # The labels' logits at each row's last prompt token.
    rows = torch.arange(len(batch.ids), device=device)
    scores = logits(hidden[rows, batch.last.to(device)], batch.label_ids.to(device))
    real = (
        torch.arange(width_n, device=device)[None, :]
        < torch.tensor(batch.n_candidates, device=device)[:, None]
    )
    return scores.masked_fill(~real, float("-inf"))


def head_scores(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    n_candidates: Sequence[int],
    *,
    labels: str = "digits",
    read: str = "label",
) -> Any:
    """The head's scores ``[B, max n]`` for rendered prompts that end with ``<ranking>``: the
    last position's logits at each candidate's label (``labels``: the spec's labelling),
    ``-inf`` past a row's own count. Right-padded, with positions counted from the mask, so a
    prompt scores the same alone or in a batch.
    Differentiable (the trainer's forward)."""
    return _forward_scores(model, _encode(tokenizer, prompts, n_candidates, labels, read))


def frozen_trunk(model: Any) -> int:
    """How many bottom decoder layers (with the embeddings) hold no trainable parameter: the
    layers whose output is a fixed function of the prompt while training (LoRA on the top
    layers only). 0 when the embeddings or the first layer train."""
    decoder, _ = _decoder_and_head(model)
    if any(p.requires_grad for p in decoder.get_input_embeddings().parameters()):
        return 0
    cut = 0
    for layer in decoder.layers:
        if any(p.requires_grad for p in layer.parameters()):
            break
        cut += 1
    return cut


@contextmanager
def only_layers(decoder: Any, part: Any) -> Any:
    """The decoder runs ``part`` of its layers (its own forward: masks, rotary positions and
    the final norm stay the model's)."""
    every = decoder.layers
    decoder.layers = part
    try:
        yield
    finally:
        decoder.layers = every


class HeadTrunk:
    """The head's forward split at the frozen trunk (:func:`frozen_trunk`): the trunk's
    output for one batch is computed once, without grad, and the top layers read it as often as
    a step needs: the policy's scores (each of ``num_iterations``) and, with the adapter
    switched off, the start model's (the KL's reference), which below the adapter *is* the
    policy. Exact, not an approximation (the tests compare it with :func:`head_scores`)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[str],
        n_candidates: Sequence[int],
        *,
        labels: str = "digits",
        read: str = "label",
        cut: int,
    ) -> None:
        import torch

        decoder, _ = _decoder_and_head(model)
        if not 0 < cut < len(decoder.layers):
            raise RankingHeadError(
                f"a trunk of {cut} layers: it must be between 1 and {len(decoder.layers) - 1}"
            )
        self.model, self.cut = model, cut
        self.batch = _encode(tokenizer, prompts, n_candidates, labels, read)
        got: dict[str, Any] = {}

        def keep(_m: Any, _a: Any, out: Any) -> None:  # before the final norm
            got["h"] = out[0] if isinstance(out, tuple) else out

        device = next(model.parameters()).device
        hook = decoder.layers[cut - 1].register_forward_hook(keep)
        try:
            with torch.no_grad(), only_layers(decoder, decoder.layers[:cut]):
                decoder(
                    input_ids=self.batch.ids.to(device),
                    attention_mask=self.batch.mask.to(device),
                    position_ids=self.batch.pos.to(device),
                    use_cache=False,
                )
        finally:
            hook.remove()
        self.hidden = got["h"]

    def scores(self, *, adapter: bool = True) -> Any:
        """The head's scores from the top layers: the policy's (differentiable in the adapter),
        or with ``adapter=False`` the base model's (call it under ``torch.no_grad``)."""
        decoder, _ = _decoder_and_head(self.model)
        if not adapter and not hasattr(self.model, "disable_adapter"):
            raise RankingHeadError("adapter=False needs a PEFT model: this one has no adapter")
        off = nullcontext() if adapter else self.model.disable_adapter()
        with off, only_layers(decoder, decoder.layers[self.cut :]):
            return _forward_scores(self.model, self.batch, inputs_embeds=self.hidden)


def prompt_scores(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    n_candidates: Sequence[int],
    batch_size: int = 8,
    *,
    labels: str = "digits",
    read: str = "label",
) -> list[list[float]]:
    """The head's scores of rendered prompts, one list a prompt (its candidates only), from
    forward passes of ``batch_size`` prompts without gradients."""
    import torch

    out: list[list[float]] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(prompts), batch_size):
                ns = list(n_candidates[i : i + batch_size])
                scores = head_scores(
                    model, tokenizer, prompts[i : i + batch_size], ns, labels=labels, read=read
                )
                out += [row[:n] for row, n in zip(scores.float().tolist(), ns, strict=True)]
    finally:
        model.train(was_training)
    return out


def rank_prompts(
    model: Any, tokenizer: Any, prompts: Sequence[str], *args: Any, **kwargs: Any
) -> list[list[int]]:
    """Greedy rankings of rendered prompts, one forward pass each: :func:`prompt_scores` (same
    arguments), best first."""
    return [order_scores(s) for s in prompt_scores(model, tokenizer, prompts, *args, **kwargs)]


def check_backend(backend: Any, read: str = "label") -> Any:
    """What the head reads a backend with: its in-process model (transformers: the logits at
    one position, or at every marker) or the backend itself, a server read through the OpenAI
    backend: ``label_logprobs`` (``read: label``, a vLLM or llama.cpp server: the next token's
    top logprobs) or ``marker_logits`` (``read: marker``: one token's logit at each marker,
    from a server named and started for it, docs/ranking_head.md); else a refusal naming the
    backend. An engine that cannot score is refused at start, not at the first request."""
    model = getattr(backend, "model", None)
    if model is not None and callable(getattr(model, "parameters", None)):
        return model
    name = getattr(backend, "name", type(backend).__name__)
    if read == "marker":
        if callable(getattr(backend, "marker_logits", None)):
            refusal = getattr(backend, "marker_read_refusal", None)
            why = refusal() if callable(refusal) else None
            if why:
                raise RankingHeadError(
                    f"head_read: marker reads a score at every candidate's closing marker: {why}"
                )
            return backend
        raise RankingHeadError(
            f"head_read: marker reads a score at every candidate's closing marker; the {name} "
            "backend returns no per-token scores (serve it with backend transformers, or openai "
            "with server: vllm or llamacpp, started for the marker read: --marker-read of "
            "scripts/vllm_cpu_server.sh or scripts/llamacpp_server.sh)"
        )
    if callable(getattr(backend, "label_logprobs", None)):
        return backend
    raise RankingHeadError(
        f"ranking_head: first_token reads the next token's scores; the {name} backend holds no "
        "model to read and returns no logprobs (use backend transformers, or openai with a vLLM "
        "or llama.cpp server)"
    )


def order_scores(scores: Sequence[float]) -> list[int]:
    """Candidates best first by score; equal scores keep the label order (deterministic ties)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def engine_scores(
    backend: Any,
    prompts: Sequence[Any],
    n_candidates: Sequence[int],
    top: int = 20,
    *,
    labels: str = "digits",
) -> list[list[float]]:
    """Each prompt's label scores (``labels``: the spec's labelling) read from a server's top
    next-token logprobs, at least ``top`` and at least as many as candidates (a vLLM server
    must then allow that many: ``--max-logprobs 64`` for 52 letters). The logprobs are
    log-softmax over the whole vocabulary, so the labels' order (and their softmax among
    themselves) is the logits' order, as in process. A label outside what the server returned
    is refused by name: it would have no score, and no score is made up."""
    label_ids = label_token_ids(backend.tokenizer, max(n_candidates), labels)
    top = max(top, max(n_candidates))
    tops = backend.label_logprobs(prompts, label_ids, top)
    out = []
    for i, (got, n) in enumerate(zip(tops, n_candidates, strict=True)):
        missing = [candidate_label(j, labels) for j in range(n) if label_ids[j] not in got]
        if missing:
            raise RankingHeadError(
                f"prompt {i}: the labels {', '.join(missing)} are not among the server's top "
                f"{top} next-token logprobs, so they have no score; raise the top-logprobs "
                "count (vLLM: --max-logprobs)"
            )
        out.append([got[label_ids[j]] for j in range(n)])
    return out


def engine_marker_scores(
    backend: Any,
    prompts: Sequence[str],
    n_candidates: Sequence[int],
    payloads: Sequence[Any] | None = None,
    *,
    labels: str = "digits",
) -> list[list[float]]:
    """Each prompt's marker-read scores from a server (``backend.marker_logits``): the logit of
    :data:`MARKER_TOKEN` at each candidate's closing marker, as :func:`head_scores` computes
    them in process. The server is sent the prompt's own tokens, the ones the positions
    index (the builder's ids equal them by construction; ``payloads`` that are ids and differ
    are refused by name, since the positions would then point elsewhere). A server that
    answers another count than a prompt's candidates is refused, naming the prompt."""
    tok = backend.tokenizer
    read_id = marker_token_id(tok)
    ids: list[list[int]] = []
    where: list[list[int]] = []
    for i, (text, n) in enumerate(zip(prompts, n_candidates, strict=True)):
        pos, toks = _marker_read(tok, text, n, labels)
        sent = None if payloads is None else payloads[i]
        if sent is not None and not isinstance(sent, str) and list(sent) != toks:
            raise RankingHeadError(
                f"prompt {i}: the token ids to send ({len(sent)}) are not the rendered text's "
                f"own ({len(toks)}), which the marker positions index"
            )
        ids.append(toks)
        where.append(pos)
    scores = backend.marker_logits(ids, where, read_id)
    if len(scores) != len(prompts):
        raise RankingHeadError(f"{len(scores)} marker-read answers for {len(prompts)} prompts")
    for i, (got, n) in enumerate(zip(scores, n_candidates, strict=True)):
        if len(got) != n:
            raise RankingHeadError(f"prompt {i}: {len(got)} marker scores for {n} candidates")
    return [[float(x) for x in got] for got in scores]


def backend_scores(
    backend: Any,
    prompts: Sequence[str],
    n_candidates: Sequence[int],
    batch_size: int = 8,
    payloads: Sequence[Any] | None = None,
    top: int = 20,
    *,
    labels: str = "digits",
    read: str = "label",
) -> list[list[float]]:
    """Each rendered prompt's head scores, one a candidate, read by a backend: its in-process
    model, or its server's top-``top`` logprobs (``payloads``: what is sent, the prompts' token
    ids by default; 20 is vLLM's default --max-logprobs, and SmolLM2-135M-Instruct puts every
    label of 60 LoCoMo test prompts within its top 10), or under ``read: marker`` its server's
    logits at the markers (:func:`engine_marker_scores`)."""
    reader = check_backend(backend, read)
    if reader is not backend:
        return prompt_scores(
            reader, backend.tokenizer, prompts, n_candidates, batch_size, labels=labels, read=read
        )
    if read == "marker":
        return engine_marker_scores(backend, prompts, n_candidates, payloads, labels=labels)
    if payloads is None:
        tok = backend.tokenizer
        payloads = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return engine_scores(backend, payloads, n_candidates, top, labels=labels)


def backend_rankings(
    backend: Any, prompts: Sequence[str], n_candidates: Sequence[int], *args: Any, **kwargs: Any
) -> list[list[int]]:
    """Greedy head rankings of rendered prompts: :func:`backend_scores` (same arguments), best
    first."""
    scores = backend_scores(backend, prompts, n_candidates, *args, **kwargs)
    return [order_scores(s) for s in scores]


def pl_place_log_probs(scores: Any, rankings: Any, temperature: float = 1.0) -> Any:
    """The per-place terms of :func:`pl_log_prob`, ``[B, G, k]``: at place j, log of the chance
    that the policy picks ``rankings[..., j]`` among the candidates not placed before j. Their
    sum is log PL(σ); the PL-GRPO trainer reads each place as a "token" (its own ratio and
    clip), and a mask over places keeps a ranking's prefix."""
    import torch

    # Padding (-inf) becomes a finite floor: a padded place then adds a constant, never a NaN
    # (-inf - -inf) to the value or its gradient.
    s = (scores / temperature).clamp_min(-1e4).unsqueeze(1).expand(-1, rankings.shape[1], -1)
    chosen = s.gather(-1, rankings)  # [B, G, k]
    # Remaining mass at each place: all scores minus those placed before it.
    placed = torch.zeros_like(s, dtype=torch.bool)
    out = []
    for j in range(rankings.shape[-1]):
        masked = s.masked_fill(placed, float("-inf"))
        out.append(chosen[..., j] - torch.logsumexp(masked, dim=-1))
        placed = placed.scatter(-1, rankings[..., j : j + 1], True)
    return torch.stack(out, -1)


def pl_prefix_kl(scores: Any, ref_scores: Any, rankings: Any, temperature: float = 1.0) -> Any:
    """KL(PL_policy ‖ PL_ref) of the rankings' prefix, estimated on the drawn ``rankings``
    ``[B, G, k]``: per place, the exact KL between the two softmaxes over the candidates not
    yet placed, summed over places, ``[B, G, k]`` (sum the last axis; mask places to keep a
    shorter prefix). By the chain rule KL(P_{1..k} ‖ Q_{1..k}) = Σ_j E_{σ<j ~ P}[KL(P(·|σ<j) ‖
    Q(·|σ<j))], so the mean over rankings drawn from the policy is unbiased for the prefix's
    KL; the first place alone (j = 0) is the head's first-place KL. Zero when the two
    agree. Padding (-inf) and placed candidates carry no mass and no NaN gradient."""
    import torch

    def logp(x: Any) -> Any:
        return (x / temperature).clamp_min(-1e4).unsqueeze(1).expand(-1, rankings.shape[1], -1)

    p_s, q_s = logp(scores), logp(ref_scores)
    placed = torch.zeros_like(p_s, dtype=torch.bool)
    out = []
    for j in range(rankings.shape[-1]):
        # -inf for placed candidates, then zeroed before any product: 0 * (-inf - -inf) would
        # put a NaN into the backward pass even where the value is masked out.
        p = torch.log_softmax(p_s.masked_fill(placed, float("-inf")), -1)
        q = torch.log_softmax(q_s.masked_fill(placed, float("-inf")), -1)
        p, q = p.masked_fill(placed, 0.0), q.masked_fill(placed, 0.0)
        w = p.exp().masked_fill(placed, 0.0)
        out.append((w * (p - q)).sum(-1))
        placed = placed.scatter(-1, rankings[..., j : j + 1], True)
    return torch.stack(out, -1)
