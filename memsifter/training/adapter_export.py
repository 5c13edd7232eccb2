"""Ship a trained proxy as a LoRA adapter: ``memsifter export-adapter``.

The epoch loop's models are full folders: LoRA checkpoints are merged before they are averaged,
and the average of several low-rank updates is not itself one adapter. What ships is the
difference ``tuned - base`` of every linear layer, factorised by a truncated SVD into PEFT's
``lora_B @ lora_A`` (``lora_alpha = r``, so the scaling is 1), and written by PEFT itself
(``save_pretrained``), so any PEFT or vLLM loader reads it. The difference of a run that trained
LoRA rank r for S merges has rank at most r * S per layer; :func:`export_adapter` measures what
the truncation loses (relative Frobenius error per matrix, and the largest absolute logit
difference on a probe prompt) and refuses a lossy export above ``max_rel_error``.

Only layers whose weights changed are adapted; every other tensor (embeddings, norms, untouched
layers) must equal the base exactly, or the export is refused: an adapter cannot carry them.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from memsifter.errors import MemSifterError

_LAYER = re.compile(r"\.layers\.(\d+)\.")


class AdapterExportError(MemSifterError, ValueError):
    """The tuned model cannot be written as an adapter of the base (named tensor, reason)."""


@dataclass
class ExportReport:
    base: str
    tuned: str
    rank: int
    modules: list[str]
    layers: list[int]
    n_matrices: int
    max_rel_error: float  # over adapted matrices, ||delta - B A||_F / ||delta||_F
    max_logit_diff: float | None  # tuned vs base + adapter on a probe prompt
    bytes: int
    files: list[str] = field(default_factory=list)


def _linear_deltas(base: Any, tuned: Any) -> dict[str, torch.Tensor]:
    """name -> tuned - base for every nn.Linear weight that changed; other changes are errors."""
    b_state = base.state_dict()
    t_state = tuned.state_dict()
    if set(b_state) != set(t_state):
        diff = sorted(set(b_state) ^ set(t_state))[:5]
        raise AdapterExportError(f"base and tuned models have different tensors, e.g. {diff}")
    linear = {
        f"{name}.weight" for name, mod in base.named_modules() if isinstance(mod, torch.nn.Linear)
    }
    out: dict[str, torch.Tensor] = {}
    for name, bt in b_state.items():
        tt = t_state[name]
        if bt.shape != tt.shape:
            raise AdapterExportError(f"tensor {name}: shape {tuple(bt.shape)} vs {tuple(tt.shape)}")
        if torch.equal(bt, tt):
            continue
        if name not in linear or name.startswith("lm_head"):
            raise AdapterExportError(
                f"tensor {name} changed but is not an adapted linear layer's weight; an adapter "
                "cannot carry it"
            )
        out[name] = tt.float() - bt.float()
    if not out:
        raise AdapterExportError("the tuned model equals the base: nothing to export")
    return out


def export_adapter(
    base_name: str,
    tuned_path: str | Path,
    out: str | Path,
    *,
    rank: int = 64,
    max_rel_error: float = 1e-3,
    probe: str | None = None,
) -> ExportReport:
    """Write ``tuned - base`` as a rank-``rank`` PEFT LoRA adapter in ``out``; the adapter
    config names ``base_name`` (a built-in name keeps it loadable offline anywhere)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from memsifter.models import load_causal_lm, load_tokenizer

    out = Path(out)
    base = load_causal_lm(base_name, "float32")
    tuned = AutoModelForCausalLM.from_pretrained(str(tuned_path), dtype=torch.float32)
    deltas = _linear_deltas(base, tuned)

    modules = sorted({name.rsplit(".", 2)[-2] for name in deltas})
    layers = sorted({int(m.group(1)) for name in deltas if (m := _LAYER.search(name))})
    # A uniform (module, layer) grid: PEFT adapts every listed module in every listed layer.
    config = LoraConfig(
        r=rank,
        lora_alpha=rank,
        lora_dropout=0.0,
        target_modules=modules,
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(base, config)
    worst = 0.0
    n = 0
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            key = name.removeprefix("base_model.model.") + ".weight"
            delta = deltas.get(key)
            a = module.lora_A["default"].weight
            b = module.lora_B["default"].weight
            if delta is None:  # unchanged in the tuned model: a zero update
                a.zero_()
                b.zero_()
                continue
            u, s, vh = torch.linalg.svd(delta, full_matrices=False)
            k = min(rank, s.numel())
            b.zero_()
            a.zero_()
            b[:, :k] = u[:, :k] * s[:k]
            a[:k, :] = vh[:k, :]
            approx = b @ a
            err = float(torch.linalg.norm(delta - approx) / torch.linalg.norm(delta))
            worst = max(worst, err)
            n += 1
    if n != len(deltas):
        raise AdapterExportError(f"{len(deltas)} matrices changed but only {n} were adapted")
    if worst > max_rel_error:
        raise AdapterExportError(
            f"rank {rank} loses too much: worst relative error {worst:.2e} > {max_rel_error:.0e}; "
            "raise --rank"
        )

    logit_diff = None
    if probe is not None:
        tok = load_tokenizer(base_name)
        ids = tok(probe, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            got = peft_model(**ids).logits
            want = tuned(**ids).logits
        logit_diff = float((got - want).abs().max())

    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    peft_model.save_pretrained(str(tmp))
    cfg_path = tmp / "adapter_config.json"
    data = json.loads(cfg_path.read_text(encoding="utf-8"))
    data["base_model_name_or_path"] = base_name
    cfg_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    files = sorted(p.name for p in out.iterdir())
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    report = ExportReport(
        base=base_name,
        tuned=str(tuned_path),
        rank=rank,
        modules=modules,
        layers=layers,
        n_matrices=n,
        max_rel_error=worst,
        max_logit_diff=logit_diff,
        bytes=size,
        files=files,
    )
    (out / "export.json").write_text(json.dumps(asdict(report), indent=2) + "\n", "utf-8")
    return report


__all__ = ["AdapterExportError", "ExportReport", "export_adapter"]
