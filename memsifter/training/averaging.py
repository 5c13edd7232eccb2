"""Checkpoint averaging: the epoch loop's "average the top-k checkpoints, start the next epoch from
the average", and ``memsifter merge``.

Full checkpoints are averaged tensor by tensor straight from their safetensors files (memory-mapped
with ``safe_open``), so averaging three Qwen3-4B checkpoints holds one output shard in memory, not
three models. A LoRA adapter has no full weights to stream: it is merged into its base model
(``merge_and_unload`` in fp32) and the merged weights are written to a scratch folder next to the
output, then streamed like any other checkpoint. Only one model is ever instantiated at a time.

Sums are accumulated in fp32 whatever the checkpoints' dtype: the mean of bf16 weights computed in
bf16 rounds every partial sum to 8 mantissa bits. The mean is also *written* in fp32 by default:
checkpoints of one epoch differ by small updates, and their mean often falls between two bf16
values (near 0.02 bf16's step is 1.2e-4, so 0.02 + 4e-5 is stored as 0.02), so a bf16 output would
round the averaging away. ``dtype="bf16"`` (``--dtype bf16``) asks for it explicitly. The output
is an ordinary ``save_pretrained`` folder (config, safetensors, generation config, the first
checkpoint's tokenizer) plus ``averaging.json`` recording what went in.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from memsifter.errors import MemSifterError

logger = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
# HF's default is 50 GB (one file for any model we train); 5 GiB shards bound the memory of the
# averaging loop, which holds one output shard at a time.
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30
# The output's floating dtype unless asked otherwise: a bf16 mean of nearby checkpoints rounds
# their differences away (see the module docstring).
DEFAULT_DTYPE = "fp32"
SINGLE_FILE = "model.safetensors"
# A checkpoint's float32 master weights, by parameter name (the head's trainer on a bf16 model):
# averaged in place of the rounded tensors, and read back by a resume.
MASTER_FILE = "master_fp32.pt"
INDEX_FILE = "model.safetensors.index.json"
REPORT_FILE = "averaging.json"
# Files AutoTokenizer reads, for the tokenizer families we may meet (BPE, SentencePiece, WordPiece).
_TOKENIZER_GLOBS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template*",
    "*.model",
)


class CheckpointError(MemSifterError, ValueError):
    """Checkpoints cannot be averaged: unreadable, or not the same architecture, tensor names and
    shapes. The message names the checkpoint and, where one is to blame, the tensor."""


@dataclass(frozen=True)
class AveragingReport:
    """What :func:`average_checkpoints` wrote; also saved as ``OUT/averaging.json``."""

    out: str
    inputs: tuple[str, ...]
    kinds: tuple[str, ...]  # "full" or "lora", per input
    base: str | None  # the base model the LoRA adapters were merged into, if any
    dtype: str  # the output's floating dtype ("bfloat16"; "mixed: ..." when kept per tensor)
    n_tensors: int
    n_parameters: int
    files: tuple[str, ...]  # weight files written
    tokenizer_from: str | None
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Source:
    path: Path  # the folder as given
    kind: str
    weights_dir: Path  # where its safetensors live (a scratch folder for a merged adapter)
    config: dict[str, Any]
    key_files: dict[str, Path]
    # For a merged adapter every floating tensor's "own" dtype is the base's stored dtype, not the
    # fp32 the merge ran in; None means "read it from the file".
    native_dtype: torch.dtype | None = None
    base: str | None = None
    base_dir: Path | None = None  # the base's local folder, when it is one
    # The trainer's float32 master weights by name (``master_fp32.pt``, the head's trainer on a
    # bf16 model): averaged in place of the bf16-rounded tensors in the safetensors.
    masters: dict[str, torch.Tensor] | None = None


def parse_dtype(name: str) -> torch.dtype:
    """``bf16`` / ``bfloat16`` / ``fp16`` / ``float16`` / ``fp32`` / ``float32`` -> torch dtype."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise CheckpointError(
            f"unknown dtype {name!r}; expected one of {', '.join(sorted(DTYPES))}"
        ) from None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"cannot read {what} {path}: {e}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{what} {path} is not a JSON object")
    return data


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it, for a ``save_pretrained`` folder."""
    from safetensors import safe_open

    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index} has no weight_map")
        files = {key: folder / name for key, name in weight_map.items()}
        missing = sorted({p.name for p in files.values() if not p.is_file()})
        if missing:
            raise CheckpointError(f"{index} lists {missing[0]}, which is missing from {folder}")
        return files
    single = folder / SINGLE_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as f:
            return {key: single for key in f.keys()}
    if any(folder.glob("global_step*")) or (folder / "zero_to_fp32.py").exists():
        raise CheckpointError(
            f"{folder} is a DeepSpeed ZeRO checkpoint without consolidated weights; train with "
            "zero3_save_16bit_model: true (configs/accelerate/deepspeed_zero3.yaml does) or run "
            "its zero_to_fp32.py first"
        )
    if any(folder.glob("pytorch_model*.bin")):
        raise CheckpointError(
            f"{folder} holds pytorch_model*.bin weights; averaging reads safetensors only "
            "(re-save the model with save_pretrained, which writes safetensors)"
        )
    raise CheckpointError(
        f"{folder} has no {SINGLE_FILE}, {INDEX_FILE} or adapter_config.json; expected a model "
        "folder, a Trainer checkpoint-N folder or a PEFT adapter folder"
    )


def _tied_targets(config: dict[str, Any]) -> dict[str, str]:
    """Tied tensor -> the tensor it shares storage with (``lm_head.weight`` ->
    ``model.embed_tokens.weight``), for the config's architecture. save_pretrained usually omits
    the target; some savers (ZeRO gathers, older transformers) write it too."""
    import transformers

    tied: dict[str, str] = {}
    for arch in config.get("architectures") or ():
        keys = getattr(getattr(transformers, arch, None), "_tied_weights_keys", None)
        if isinstance(keys, dict):  # transformers 5: {target: source}
            tied.update({str(k): str(v) for k, v in keys.items()})
        elif keys:  # transformers 4: a list of targets, the source being the input embeddings
            tied.update({str(k): "model.embed_tokens.weight" for k in keys})
    return tied


def _merge_lora(adapter_dir: Path, base: str | None, scratch: Path) -> _Source:
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    from memsifter.models import resolve_model

    adapter_config = _read_json(adapter_dir / "adapter_config.json", "adapter config")
    base_name = base or adapter_config.get("base_model_name_or_path")
    if not base_name:
        raise CheckpointError(
            f"adapter {adapter_dir} names no base model (base_model_name_or_path is empty); "
            "pass the base explicitly (--base MODEL)"
        )
    try:
        resolved = resolve_model(str(base_name))
    except MemSifterError as e:
        raise CheckpointError(f"base model of adapter {adapter_dir}: {e}") from e
    base_config = AutoConfig.from_pretrained(resolved.path)
    stored = getattr(base_config, "dtype", None) or getattr(base_config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = DTYPES.get(stored, torch.float32)
    native = stored if isinstance(stored, torch.dtype) else torch.float32

    logger.info("merging LoRA adapter %s into %s", adapter_dir, base_name)
    # fp32 so the merged delta B @ A * scale is not rounded before the fp32 averaging sees it.
    model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except Exception as e:  # peft raises a mix of ValueError/RuntimeError/KeyError here
        raise CheckpointError(f"cannot merge adapter {adapter_dir} into {base_name}: {e}") from e
    merged.save_pretrained(str(scratch))
    del model, merged
    gc.collect()
    return _Source(
        path=adapter_dir,
        kind="lora",
        weights_dir=scratch,
        config=_read_json(scratch / "config.json", "merged config"),
        key_files=_weight_files(scratch),
        native_dtype=native,
        base=str(base_name),
        base_dir=Path(resolved.path) if resolved.local else None,
    )


def _open_source(path: Path, base: str | None, scratch: Path) -> _Source:
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is not a folder")
    if (path / "adapter_config.json").is_file():
        return _merge_lora(path, base, scratch)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"checkpoint {path} has no config.json")
    masters = path / MASTER_FILE
    return _Source(
        path=path,
        kind="full",
        weights_dir=path,
        config=_read_json(path / "config.json", "model config"),
        key_files=_weight_files(path),
        masters=torch.load(masters, weights_only=True) if masters.is_file() else None,
    )


def _check_compatible(sources: list[_Source]) -> list[str]:
    """The tensor names to average, in the first checkpoint's order; raises on any mismatch."""
    first = sources[0]
    for src in sources[1:]:
        for field in ("model_type", "architectures"):
            if src.config.get(field) != first.config.get(field):
                raise CheckpointError(
                    f"checkpoint {src.path} has {field}={src.config.get(field)!r} but the first "
                    f"checkpoint {first.path} has {first.config.get(field)!r}"
                )

    # A tied target present in only some checkpoints is a saving detail, not a different model:
    # drop it everywhere and let the loader re-tie it from its source. (Looking the tie up imports
    # the model class, seconds of transformers imports, so only when the key sets differ.)
    differ = any(s.key_files.keys() != first.key_files.keys() for s in sources[1:])
    tied = _tied_targets(first.config) if differ else {}
    for target, tie_source in tied.items():
        have = [target in s.key_files for s in sources]
        if any(have) and not all(have) and all(tie_source in s.key_files for s in sources):
            for s in sources:
                s.key_files.pop(target, None)

    keys = list(first.key_files)
    expected = set(keys)
    for src in sources[1:]:
        got = set(src.key_files)
        missing, extra = sorted(expected - got), sorted(got - expected)
        if missing or extra:
            what = f"lacks tensor {missing[0]!r}" if missing else f"has extra tensor {extra[0]!r}"
            more = len(missing) + len(extra) - 1
            raise CheckpointError(
                f"checkpoint {src.path} {what} compared with the first checkpoint {first.path}"
                + (f" ({more} more differences)" if more else "")
            )
    return keys


def _plan_shards(keys: list[str], sizes: dict[str, int], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    used = 0
    for key in keys:
        if shards[-1] and used + sizes[key] > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += sizes[key]
    return shards


def _copy_tokenizer(candidates: list[Path], out: Path) -> Path | None:
    for folder in candidates:
        files = sorted({p for pattern in _TOKENIZER_GLOBS for p in folder.glob(pattern)})
        files = [p for p in files if p.is_file()]
        if files:
            for p in files:
                shutil.copy2(p, out / p.name)
            return folder
    return None


def average_checkpoints(
    paths: Sequence[Path | str],
    out: Path | str,
    *,
    dtype: str | None = DEFAULT_DTYPE,
    base: str | None = None,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> AveragingReport:
    """Average ``paths`` (model folders, Trainer ``checkpoint-N`` folders or PEFT LoRA adapter
    folders, in any mix) into a new ``save_pretrained`` folder ``out``.

    Every floating tensor is the fp32 mean of its inputs, saved in ``dtype`` (``bf16``/``fp16``/
    ``fp32``; default ``fp32``, so that differences below bf16's resolution survive; ``None``:
    each tensor keeps the first checkpoint's dtype, the base's stored dtype when the first is an
    adapter). Non-floating tensors must be equal and are copied. Adapters are
    merged into ``base`` (default: their ``base_model_name_or_path``) first. ``out`` must not exist
    or be empty; it appears only when complete (written beside it, then renamed).
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    started = time.perf_counter()
    if not paths:
        raise CheckpointError("no checkpoints to average")
    out_dtype = parse_dtype(dtype) if dtype is not None else None
    inputs = [Path(p).expanduser().resolve() for p in paths]
    out = Path(out).expanduser().resolve()
    for dup, count in Counter(inputs).items():
        if count > 1:
            raise CheckpointError(f"checkpoint {dup} is listed {count} times")
    if out in inputs:
        raise CheckpointError(f"output folder {out} is one of the checkpoints")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"output {out} already exists and is not an empty folder")

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        sources = [
            _open_source(p, base, partial / "_merged" / str(i)) for i, p in enumerate(inputs)
        ]
        keys = _check_compatible(sources)
        with contextlib.ExitStack() as stack:
            handles = {
                f: stack.enter_context(safe_open(str(f), framework="pt"))
                for f in sorted({f for s in sources for f in s.key_files.values()})
            }
            target, numel = _check_shapes(sources, keys, handles, out_dtype)
            sizes = {k: numel[k] * torch.empty((), dtype=target[k]).element_size() for k in keys}
            shards = _plan_shards(keys, sizes, max_shard_bytes)
            names = (
                [SINGLE_FILE]
                if len(shards) == 1
                else [
                    f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                    for i in range(1, len(shards) + 1)
                ]
            )
            for name, shard in zip(names, shards, strict=True):
                tensors = {k: _mean(k, sources, handles, target[k]) for k in shard}
                save_file(tensors, str(partial / name), metadata={"format": "pt"})
                del tensors
        if len(names) > 1:
            weight_map = {k: name for name, shard in zip(names, shards, strict=True) for k in shard}
            index = {"metadata": {"total_size": sum(sizes.values())}, "weight_map": weight_map}
            (partial / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")

        float_dtypes = Counter(target[k] for k in keys if target[k].is_floating_point)
        out_name = (
            "mixed: " + ", ".join(_dtype_name(d) for d, _ in float_dtypes.most_common())
            if len(float_dtypes) > 1
            else _dtype_name(next(iter(float_dtypes), torch.float32))
        )
        first = sources[0]
        config = dict(first.config)
        if float_dtypes:
            main = _dtype_name(float_dtypes.most_common(1)[0][0])
            config["dtype"] = main
            if "torch_dtype" in config:  # transformers 4 spelling
                config["torch_dtype"] = main
        (partial / "config.json").write_text(
            json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        gen = first.weights_dir / "generation_config.json"
        if gen.is_file():
            shutil.copy2(gen, partial / gen.name)
        tokenizer_candidates = [s.path for s in sources] + [
            s.base_dir for s in sources if s.base_dir is not None
        ]
        tokenizer_from = _copy_tokenizer(tokenizer_candidates, partial)
        if tokenizer_from is None:
            logger.warning("no tokenizer files in %s; %s has weights only", first.path, out)
        shutil.rmtree(partial / "_merged", ignore_errors=True)

        report = AveragingReport(
            out=str(out),
            inputs=tuple(str(p) for p in inputs),
            kinds=tuple(s.kind for s in sources),
            base=next((s.base for s in sources if s.base), None),
            dtype=out_name,
            n_tensors=len(keys),
            n_parameters=sum(numel.values()),
            files=tuple(names),
            tokenizer_from=str(tokenizer_from) if tokenizer_from else None,
            seconds=round(time.perf_counter() - started, 3),
        )
        (partial / REPORT_FILE).write_text(
            json.dumps(report.to_json(), indent=2) + "\n", encoding="utf-8"
        )
        if out.exists():
            out.rmdir()  # checked empty above
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return report


def _check_shapes(
    sources: list[_Source],
    keys: list[str],
    handles: dict[Path, Any],
    out_dtype: torch.dtype | None,
) -> tuple[dict[str, torch.dtype], dict[str, int]]:
    """Every tensor's output dtype and element count; raises on a shape or kind mismatch.
    Reads headers only."""
    first = sources[0]
    target: dict[str, torch.dtype] = {}
    numel: dict[str, int] = {}
    for key in keys:
        meta = []
        for src in sources:
            sl = handles[src.key_files[key]].get_slice(key)
            raw = sl.get_dtype()
            if raw not in _SAFETENSORS_DTYPES:
                raise CheckpointError(
                    f"tensor {key!r} in checkpoint {src.path} has unsupported dtype {raw}"
                )
            meta.append((tuple(sl.get_shape()), _SAFETENSORS_DTYPES[raw]))
        shape0, dtype0 = meta[0]
        for src, (shape, dt) in zip(sources[1:], meta[1:], strict=True):
            if shape != shape0:
                raise CheckpointError(
                    f"tensor {key!r} has shape {list(shape)} in checkpoint {src.path} but "
                    f"{list(shape0)} in the first checkpoint {first.path}"
                )
            if dt.is_floating_point != dtype0.is_floating_point:
                raise CheckpointError(
                    f"tensor {key!r} is {_dtype_name(dt)} in checkpoint {src.path} but "
                    f"{_dtype_name(dtype0)} in the first checkpoint {first.path}"
                )
        if not dtype0.is_floating_point:
            target[key] = dtype0
        else:
            target[key] = out_dtype or first.native_dtype or dtype0
        n = 1
        for d in shape0:
            n *= d
        numel[key] = n
    return target, numel


def _mean(
    key: str, sources: list[_Source], handles: dict[Path, Any], dtype: torch.dtype
) -> torch.Tensor:
    tensors = (
        s.masters[key]
        if s.masters is not None and key in s.masters
        else handles[s.key_files[key]].get_tensor(key)
        for s in sources
    )
    first = next(tensors)
    if not first.is_floating_point():
        # Integer buffers (position ids, counters) have no meaningful mean; they must agree.
        for src, t in zip(sources[1:], tensors, strict=True):
            if not torch.equal(t, first):
                raise CheckpointError(
                    f"non-floating tensor {key!r} differs between checkpoint {src.path} and the "
                    f"first checkpoint {sources[0].path}; it cannot be averaged"
                )
        return first.contiguous()
    acc = first.to(torch.float32, copy=True)
    for t in tensors:
        acc.add_(t.to(torch.float32))
    acc.div_(len(sources))
    return acc.to(dtype).contiguous()
