"""Who does what in a multi-process run (``accelerate launch``, torchrun): the epoch loop's
process roles.

Training (SFT and every GRPO epoch) is collective: every process runs it. Everything between
two trainers is done by the main process alone: validating checkpoints, averaging them, the
curriculum's re-score, and writing ``run_state.json``, reports and plots. Two processes
averaging into one folder, or renaming one temp file onto ``run_state.json``, race; N processes
validating the same checkpoints waste N - 1 GPUs' time. The others wait at a barrier, then read
what the main process decided (:meth:`Processes.run_on_main` broadcasts its return value), so
every process starts the next epoch from the same model folder and the same selected data.

A failure on the main process is broadcast too: the others raise instead of waiting at the
barrier until the process group's timeout. That timeout (``TrainConfig.barrier_timeout_s``)
must cover the main process's longest solo stretch (validation of an epoch's checkpoints plus
the curriculum's re-score), since the others sit in a collective for all of it; it is set when
the process group starts here, before the Trainer would start it with its 30-minute default.

The output folder must be storage every process sees (one folder per run, not per node):
the main process writes the models the others load.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")


def launched_world_size() -> int:
    """Processes in this run, as the launcher (accelerate, torchrun) announced them."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class MainProcessError(RuntimeError):
    """The main process failed while the others waited for its result."""


@dataclass(frozen=True)
class Processes:
    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: T) -> T:
        """The main process's ``obj`` on every process (picklable objects only)."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_rows(self, t: Any) -> Any:
        """Every process's ``t`` (the same shape on each), concatenated along the first
        dimension in rank order, on every process: the global batch's rows."""
        if not self.distributed:
            return t
        import torch
        import torch.distributed as dist

        local = t.contiguous().to(self.device)
        parts = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(parts, local)
        return torch.cat(parts).to(t.device)

    def mean(self, value: float) -> float:
        """The mean of a number over the processes."""
        if not self.distributed:
            return value
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t) / self.world

    def average_gradients(self, params: Any) -> None:
        """Each parameter's gradient replaced by its mean over the processes (one flat
        all-reduce): a step on the mean of the processes' micro-batch losses, as DDP takes it."""
        if not self.distributed:
            return
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= self.world
        for g, avg in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(avg)

    @property
    def device(self) -> Any:
        """Where collectives' tensors live: the process's GPU under NCCL, else the CPU."""
        import torch
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def run_on_main(self, fn: Callable[[], T], what: str) -> T:
        """``fn()`` on the main process only; every process returns its result. A failure on
        the main process raises there and, as :class:`MainProcessError`, on the others."""
        if not self.distributed:
            return fn()
        result: Any = None
        if self.is_main:
            try:
                result = fn()
            except BaseException as e:
                self.broadcast(("error", f"{type(e).__name__}: {e}"))
                raise
        kind, payload = self.broadcast(("ok", result) if self.is_main else None)  # type: ignore[misc]
        if kind == "error":
            raise MainProcessError(f"the main process failed during {what}: {payload}")
        return payload  # type: ignore[no-any-return]


def start_processes(timeout_s: float) -> Processes:
    """This process's rank and the run's size; starts the process group (gloo on CPU, NCCL on
    GPU, through accelerate's ``PartialState``) when the launcher started more than one."""
    if launched_world_size() <= 1:
        return Processes()
    import torch
    from accelerate import PartialState

    # The launcher's --cpu (or a machine without CUDA) means gloo; the Trainer later asks for
    # the same state (use_cpu) and gets this one.
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes") or not (
        torch.cuda.is_available()
    )
    state = PartialState(cpu=cpu, timeout=timedelta(seconds=timeout_s))
    return Processes(rank=state.process_index, world=state.num_processes)
