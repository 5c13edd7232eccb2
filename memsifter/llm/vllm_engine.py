"""In-process vLLM engine (``vllm.LLM``): the fastest path on a GPU box. Imported only when
vllm is installed (the ``gpu`` extra); nothing else in the package depends on it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsifter.errors import MemSifterError
from memsifter.llm.base import Generation, SamplingParams
from memsifter.models import plain_model_folder


class VLLMBackend:
    name = "vllm"

    def __init__(
        self,
        model: str,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        tensor_parallel_size: int = 1,
        **engine_args: Any,
    ) -> None:
        """``engine_args`` go to ``vllm.LLM`` unchanged (``enforce_eager``, ``quantization`` ...).
        vLLM starts worker processes with spawn: build it under ``if __name__ == "__main__"``."""
        try:
            from vllm import LLM
        except ImportError as e:
            raise MemSifterError(
                "the vllm backend needs vllm: pip install 'memsifter[gpu]' "
                "(or use --backend openai against a vllm server)"
            ) from e
        self.model_name = model
        kwargs: dict[str, Any] = dict(
            # vLLM loads a plain folder: a LoRA adapter is merged into its base once (cached).
            model=plain_model_folder(model),
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        if gpu_memory_utilization:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        kwargs.update(engine_args)
        self.llm = LLM(**kwargs)

    @property
    def tokenizer(self) -> Any:
        return self.llm.get_tokenizer()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Generation]]:
        import time

        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=sampling.seed,
            stop=list(sampling.stop) or None,
        )
        t0 = time.perf_counter()
        outs = self.llm.generate(list(prompts), params, use_tqdm=False)
        latency = time.perf_counter() - t0
        return [
            [
                Generation(
                    text=c.text,
                    prompt_tokens=len(o.prompt_token_ids or ()),
                    completion_tokens=len(c.token_ids),
                    finish_reason=c.finish_reason or "stop",
                    latency_s=latency,
                )
                for c in o.outputs
            ]
            for o in outs
        ]

    def close(self) -> None:
        """Shut the engine down and give its GPU memory back, so a later engine (the next
        checkpoint's validation) or the next epoch's trainer fits on the same device. vLLM's
        own ``LLM.shutdown`` where it has one, else the V1 engine core's; only then is the
        object dropped (garbage collection alone leaves the engine's memory held). vLLM's
        ``destroy_distributed_environment`` is not called: it would also tear down the
        training processes' own torch.distributed group."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        shutdown = getattr(llm, "shutdown", None)
        if shutdown is None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        del llm
        import gc

        gc.collect()
        try:
            import torch
        except ImportError:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
