"""The reports of a run the guards stop: where, what came before, the fixes."""

import lightning as L
import torch


def nonfinite_gradients(trainer: L.Trainer, bad: list[str], total: int,
                        previous: tuple[torch.Tensor, list[str]] | None, batch: str | None,
                        top: int = 5) -> str:
    """``bad``: the parameter names with a non-finite gradient; ``previous``: the gradient norms
    (and names) of the last healthy step; ``batch``: this step's input, its statistics per channel."""
    loss = trainer.callback_metrics.get("train/loss")
    lrs = [g["lr"] for opt in trainer.optimizers for g in opt.param_groups]
    lines = [f"non-finite gradients at step {trainer.global_step} (epoch {trainer.current_epoch}) in "
             f"{len(bad)} of {total} parameter tensors, first (forward order): {', '.join(bad[:top])}"]
    if previous is not None:
        norms, names = previous
        largest = norms.topk(min(top, len(names)))
        lines.append("  largest gradient norms at the last healthy step: " + ", ".join(
            f"{names[i]} {v:.3g}"
            for v, i in zip(largest.values.tolist(), largest.indices.tolist(), strict=True)))
    if batch is not None:
        lines.append(f"  input batch: {batch}")
    if loss is not None:
        lines.append(f"  last logged train/loss: {float(loss):.4g}")
    lines.append(f"  learning rates now: {', '.join(f'{lr:.3g}' for lr in lrs)}")
    lines.append("  fixes: lower model.lr (try 10x smaller, or make lr-find); clip gradients "
                 "(trainer.gradient_clip_val=1.0); check the data for NaN/Inf (make "
                 "check-data); try trainer.precision=32-true. The last good checkpoint is "
                 "untouched: resume from it after the fix.")
    return "\n".join(lines)


def untrained_parameters(hidden: list[str], missing: list[str]) -> str:
    """``hidden``: layers in plain containers; ``missing``: trainable parameters in no optimiser."""
    lines = ["parameters that would never train:"]
    if hidden:
        lines += ["  layers in a plain Python list/tuple/dict, unseen by model.parameters(): "
                  + ", ".join(hidden), "  fix: hold them in nn.ModuleList / nn.ModuleDict"]
    if missing:
        lines += ["  trainable parameters in no optimiser param group: " + ", ".join(missing),
                  "  fix: include them in configure_optimizers (or set requires_grad=False)"]
    return "\n".join(lines)
