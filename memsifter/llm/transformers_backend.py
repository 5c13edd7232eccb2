"""Local transformers backend (CPU or GPU) with batched, left-padded generation.

Prompts are sorted by length and generated in batches of ``batch_size`` so padding waste stays
small; results come back in the caller's order. The model is any name
:func:`memsifter.models.load_causal_lm` takes, a PEFT adapter folder included (merged on load).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from memsifter.llm.base import Generation, SamplingParams
from memsifter.machine import cpu_bf16_units, emulated_bf16_text
from memsifter.models import load_causal_lm, load_tokenizer

logger = logging.getLogger(__name__)


class TransformersBackend:
    name = "transformers"

    def __init__(
        self,
        model: str,
        device: str | None = None,
        dtype: str = "float32",
        batch_size: int = 8,
        threads: int | None = None,
    ) -> None:
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.model_name = model
        self._tok = load_tokenizer(model)
        # Decoder-only batching: every row's new tokens must start at the same position.
        self._tok.padding_side = "left"
        if self._tok.pad_token_id is None:
            self._tok.pad_token = self._tok.eos_token
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if str(dtype) in ("bfloat16", "bf16") and self.device == "cpu" and not cpu_bf16_units():
            # Chosen, never inferred: the config asked for it, so it is kept, but said once.
            logger.warning(
                emulated_bf16_text(
                    "dtype bfloat16",
                    "set the dtype to float32 on this machine (python -m "
                    "eval.bench.bench_head_latency measures both)",
                )
            )
        self.model = load_causal_lm(model, dtype)
        self.model.to(self.device).eval()
        self.batch_size = batch_size
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = gen_cfg.eos_token_id if gen_cfg is not None else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        eos_ids.add(self._tok.eos_token_id)
        self._eos = sorted(i for i in eos_ids if i is not None)

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        import torch

        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[list[Generation]] = [[] for _ in prompts]
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            enc = self._tok(
                [prompts[i] for i in idx],
                return_tensors="pt",
                padding=True,
                add_special_tokens=False,
            ).to(self.device)
            kwargs: dict[str, Any] = dict(
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=sampling.n,
                eos_token_id=self._eos,
                pad_token_id=self._tok.pad_token_id,
            )
            if sampling.greedy:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            else:
                kwargs.update(
                    do_sample=True,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=None,
                )
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed + start)
            if sampling.stop:
                kwargs.update(stop_strings=list(sampling.stop), tokenizer=self._tok)
            t0 = time.perf_counter()
            with torch.inference_mode():
                seqs = self.model.generate(**enc, **kwargs)
            latency = time.perf_counter() - t0
            prompt_len = enc["input_ids"].shape[1]
            new = seqs[:, prompt_len:]
            for row in range(new.shape[0]):
                i = idx[row // sampling.n]
                toks = new[row]
                n_pad_left = int((enc["attention_mask"][row // sampling.n] == 0).sum())
                keep = _strip_after_eos(toks, self._eos)
                n_completion = int(keep.shape[0])
                finished = bool(n_completion) and int(keep[-1]) in self._eos
                out[i].append(
                    Generation(
                        text=self._tok.decode(keep, skip_special_tokens=True),
                        prompt_tokens=prompt_len - n_pad_left,
                        completion_tokens=n_completion,
                        finish_reason="stop" if finished else "length",
                        latency_s=latency,
                    )
                )
        return out


def _strip_after_eos(tokens: Any, eos: list[int]) -> Any:
    """Tokens up to and including the first EOS: later positions are padding, whatever the pad
    token is (SmolLM2 pads with its EOS)."""
    for pos, tok in enumerate(tokens.tolist()):
        if tok in eos:
            return tokens[: pos + 1]
    return tokens
