"""One-GPU check of the paper-scale recipe (issue 37, item 5): for Qwen3-4B's architecture (random
weights from the shipped config, configs/models/Qwen3-4B-Thinking-2507/config.json: there is no
hub on a borrowed GPU), in bf16 with gradient checkpointing, with LoRA and with full fine-tuning,
the peak GPU memory and seconds of one training step of both heads at prompt lengths of 8K, 32K
and 128K tokens; then the head's recall latency (one prefill, the ranking read from the last
position) at 32K and 128K (the paper: MemSifter 3.98 s at 128K, BGE-M3 1.02 s; the goal here is
<= 1.0 s).

What a step is, per head:
- ``first_token``: one forward of the prompt with the logits read at the last position only, a
  cross-entropy over 20 label tokens, backward, optimizer step.
- ``generate``: the GRPO update's forward and backward over the prompt plus a completion of
  ``--completion`` tokens (log-probabilities of the completion's tokens), optimizer step. The
  rollout that writes the completion is vLLM's job and is not timed (no vLLM on that machine).

Full fine-tuning keeps float32 master weights and AdamW states (the head trainer's rule), so its
memory is what the recipe needs. A row that runs out of memory is reported as OOM; rows are
skipped once ``--budget-s`` is spent. PASS: every LoRA row of both heads ran at every length.
Only torch, transformers and peft are imported, the packages the borrowed machine has.

    python -m eval.bench.bench_gpu_step --out DIR            # on a GPU
    python -m eval.bench.bench_gpu_step --dry-run --out DIR  # on CPU: a tiny model, short prompts
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs/models/Qwen3-4B-Thinking-2507/config.json"
N_LABELS = 20  # the head's label tokens (a window's candidates)


def build_model(config_path: Path, device: str, dtype: Any, tiny: bool) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(config_path.parent))
    if tiny:  # the same architecture, small enough for a CPU: the dry run's code paths
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers = 64, 128, 2
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, 16
        cfg.vocab_size = 1024
    cfg.use_cache = False
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model


def prepare(model: Any, mode: str) -> tuple[Any, list[Any], list[Any] | None, Any]:
    """The model for ``mode`` (lora | full) with gradient checkpointing, its trainable
    parameters, their float32 masters (full fine-tune in bf16) and AdamW over them."""
    import torch

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
    params = [p for p in model.parameters() if p.requires_grad]
    masters = None
    if any(p.dtype != torch.float32 for p in params):
        masters = [p.detach().float().clone().requires_grad_(True) for p in params]
    opt = torch.optim.AdamW(masters or params, lr=1e-6)
    model.train()
    return model, params, masters, opt


def train_step(
    model: Any, params: list[Any], masters: list[Any] | None, opt: Any, head: str, length: int,
    completion: int, vocab: int, device: str,
) -> None:  # fmt: skip
    import torch

    ids = torch.randint(0, vocab, (1, length + (completion if head == "generate" else 0)),
                        device=device)  # fmt: skip
    if head == "first_token":
        logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1, :N_LABELS].float()
        loss = torch.nn.functional.cross_entropy(logits, torch.zeros(1, dtype=torch.long,
                                                                     device=device))  # fmt: skip
    else:
        # log-probabilities of the completion's tokens, the policy-gradient surrogate's input
        logits = model(input_ids=ids, logits_to_keep=completion + 1).logits[:, :-1].float()
        target = ids[:, -completion:]
        logp = torch.log_softmax(logits, -1).gather(-1, target[..., None]).squeeze(-1)
        loss = -logp.mean()
    loss.backward()
    if masters is not None:
        for m, p in zip(masters, params, strict=True):
            m.grad = p.grad.float()
            p.grad = None
    opt.step()
    opt.zero_grad(set_to_none=True)
    if masters is not None:
        with torch.no_grad():
            for m, p in zip(masters, params, strict=True):
                p.copy_(m)


def recall_latency(model: Any, length: int, vocab: int, device: str, sync: Any) -> float:
    import torch

    ids = torch.randint(0, vocab, (1, length), device=device)
    model.eval()
    with torch.inference_mode():
        model(input_ids=ids, logits_to_keep=1)  # warm
        sync()
        t0 = time.perf_counter()
        model(input_ids=ids, logits_to_keep=1)
        sync()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny model, short prompts")
    ap.add_argument("--lengths", default=None, help="prompt lengths (default 8192,32768,131072)")
    ap.add_argument("--completion", type=int, default=2048, help="generate head's completion")
    ap.add_argument("--heads", default="first_token,generate")
    ap.add_argument("--modes", default="lora,full")
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip rows past this")
    args = ap.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("bench_gpu_step: no CUDA GPU (torch.cuda.is_available() is False); --dry-run runs "
              "the same code on CPU with a tiny model", file=sys.stderr)  # fmt: skip
        print("FAIL (not started)")
        return 2
    device = "cuda" if cuda and not args.dry_run else "cpu"
    tiny = args.dry_run
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    lengths = [int(x) for x in (args.lengths or ("64,128" if tiny else "8192,32768,131072"))
               .split(",")]  # fmt: skip
    completion = min(args.completion, 16) if tiny else args.completion
    recall_lengths = [x for x in lengths if x >= (128 if tiny else 32768)]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    def peak_gb() -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None

    t_start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for mode in args.modes.split(","):
        for head in args.heads.split(","):
            model = build_model(CONFIG, device, dtype, tiny)
            vocab = model.config.vocab_size
            model, params, masters, opt = prepare(model, mode)
            for i, length in enumerate(lengths):
                row: dict[str, Any] = {"head": head, "mode": mode, "prompt_tokens": length}
                if time.perf_counter() - t_start > args.budget_s:
                    rows.append({**row, "status": "skipped (time budget)"})
                    continue
                try:
                    if i == 0:  # warm the kernels once per model
                        train_step(model, params, masters, opt, head, length, completion,
                                   vocab, device)  # fmt: skip
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    sync()
                    t0 = time.perf_counter()
                    train_step(model, params, masters, opt, head, length, completion, vocab,
                               device)  # fmt: skip
                    sync()
                    row |= {"status": "ok", "s_per_step": time.perf_counter() - t0,
                            "peak_gb": peak_gb()}  # fmt: skip
                except torch.OutOfMemoryError:
                    row |= {"status": "OOM", "peak_gb": peak_gb()}
                    opt.zero_grad(set_to_none=True)
                    for p in params:
                        p.grad = None
                rows.append(row)
                print(json.dumps(row), flush=True)
                if device == "cuda":
                    torch.cuda.empty_cache()
            if mode == "lora" and head == "first_token":
                for length in recall_lengths:
                    if time.perf_counter() - t_start > args.budget_s:
                        break
                    try:
                        s = recall_latency(model, length, vocab, device, sync)
                        rows.append({"head": "recall", "mode": "prefill",
                                     "prompt_tokens": length, "status": "ok", "s_per_step": s,
                                     "peak_gb": peak_gb()})  # fmt: skip
                    except torch.OutOfMemoryError:
                        rows.append({"head": "recall", "mode": "prefill",
                                     "prompt_tokens": length, "status": "OOM"})  # fmt: skip
                    print(json.dumps(rows[-1]), flush=True)
            del model, params, masters, opt
            if device == "cuda":
                torch.cuda.empty_cache()

    lora_ok = all(r["status"] == "ok" for r in rows if r["mode"] == "lora")
    if device == "cuda":
        gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        machine = f"{torch.cuda.get_device_name()} ({gib:.0f} GiB)"
    else:
        cpu = platform.processor() or platform.machine()
        machine = f"CPU dry run ({cpu}): a tiny model, not Qwen3-4B"
    lines = [
        "# One-GPU step check: Qwen3-4B's architecture, random weights, gradient checkpointing",
        "",
        f"- machine: {machine}; torch {torch.__version__}",
        f"- generate head's completion: {completion} tokens (rollout not timed)",
        f"- wall: {time.perf_counter() - t_start:.0f} s",
        "",
        "| head | mode | prompt tokens | status | s / step | peak GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r.get("s_per_step")
        gb = r.get("peak_gb")
        lines.append(
            f"| {r['head']} | {r['mode']} | {r['prompt_tokens']:,} | {r['status']} | "
            f"{'–' if s is None else f'{s:.2f}'} | {'–' if gb is None else f'{gb:.1f}'} |"
        )
    verdict = "PASS" if lora_ok else "FAIL"
    if tiny:
        verdict = f"DRY RUN ({'code paths ok' if lora_ok else 'FAILED'}; the check needs a GPU)"
    lines += ["", verdict]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_gpu_step.md").write_text("\n".join(lines) + "\n")
    (args.out / "bench_gpu_step.json").write_text(
        json.dumps({"machine": machine, "rows": rows, "verdict": verdict}, indent=2) + "\n"
    )
    print("\n".join(lines))
    return 0 if lora_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
