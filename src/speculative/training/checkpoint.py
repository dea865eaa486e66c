"""Shared pieces of the training loops: the epoch loop, warm-up + cosine schedule and per-epoch
checkpoints that resume (the int8 per-row storage of shipped drafters is :mod:`speculative.storage`)."""

from __future__ import annotations

import math
from pathlib import Path


def cosine_schedule(opt, total_steps: int, warmup_steps: int):
    """Linear warm-up over ``warmup_steps`` optimizer steps, then cosine decay to 0 at ``total_steps``."""
    import torch

    total = max(1, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
    )


def optimizer_step(loss, params, opt, sched, max_grad_norm: float = 1.0) -> float:
    """One training step: backward, gradient clipping to ``max_grad_norm``, optimizer and schedule
    steps; returns the loss as a float."""
    import torch

    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    opt.step()
    sched.step()
    return loss.item()


class EpochCheckpoint:
    """``checkpoint.pt`` in a run folder: model, optimizer and schedule state after each finished epoch.

    ``resume()`` returns ``(epochs_done, history)``; ``save()`` writes atomically (a temporary file
    replaced in one rename), so an interrupted run never leaves a half-written checkpoint.
    """

    def __init__(self, out_dir: Path, model, opt, sched):
        self.path = Path(out_dir) / "checkpoint.pt"
        self.model, self.opt, self.sched = model, opt, sched

    def resume(self) -> tuple[int, list[dict]]:
        import torch

        if not self.path.exists():
            return 0, []
        try:
            st = torch.load(self.path, weights_only=False, map_location="cpu")  # load_state_dict moves it
            self.model.load_state_dict(st["model"])
            self.opt.load_state_dict(st["opt"])
            self.sched.load_state_dict(st["sched"])
            return int(st["epoch"]), list(st["history"])
        except Exception as e:  # torch raises many types for a damaged or foreign file
            from ..errors import SpeculativeError

            raise SpeculativeError(f"{self.path}: damaged or not this run's checkpoint ({type(e).__name__}: "
                                   f"{str(e)[:200]}); delete it to train again from the first epoch, or pass --fresh"
                                   ) from None

    def save(self, epochs_done: int, history: list[dict]) -> None:
        import torch

        tmp = self.path.with_suffix(".tmp")
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                    "epoch": epochs_done, "history": history}, tmp)
        tmp.replace(self.path)


def train_epochs(model, checkpoint: EpochCheckpoint, epochs: int, batches, loss_fn, params, opt, sched,
                 desc: str, progress: bool = True, validate=None) -> list[dict]:
    """Run (or resume) the epochs ``checkpoint`` has not finished; returns the per-epoch history.

    Args:
        batches: ``batches(epoch)`` -> a sized sequence of batches (seeded per epoch, so a resumed
            run sees the same order as an uninterrupted one).
        loss_fn: ``loss_fn(batch)`` -> ``(loss tensor or None to skip, top-1 accuracy float)``.
        validate: optional ``validate()`` -> dict of metrics added to the epoch's record (run in
            eval mode).
    """
    import numpy as np
    from tqdm import tqdm

    start, history = checkpoint.resume()
    for epoch in range(start, epochs):
        model.train()
        todo = batches(epoch)
        bar = tqdm(total=len(todo), desc=f"{desc} epoch {epoch + 1}/{epochs}", disable=not progress)
        losses = []
        for batch in todo:
            loss, top1 = loss_fn(batch)
            if loss is None:
                continue
            losses.append(optimizer_step(loss, params, opt, sched))
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}", top1=f"{top1:.2f}")
            bar.update(1)
        bar.close()
        model.eval()
        record = {"epoch": epoch + 1, "train_loss": float(np.mean(losses)) if losses else float("nan")}
        if validate is not None:
            record.update(validate())
        history.append(record)
        checkpoint.save(epoch + 1, history)
    return history
