"""Numbers per image (a count, an age, a quality score, an angle): a labels table with numeric
columns instead of a label (``image,value``; several columns: several outputs).

The network learns the targets standardised with the training split's mean and standard
deviation (``label_stats``, linked from the data), so one learning rate suits counts and
kilograms alike; every metric and answer is in the targets' own units. The scaling travels in
the checkpoint (hyperparameters) and the ONNX metadata (``state``). Best checkpoint: lowest
``val/mae``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from torch import nn
from torchmetrics import CatMetric, MeanAbsoluteError, MeanMetric, Metric

from project.errors import ConfigError
from project.tasks.base import Task


def huber(task: Task, out: torch.Tensor, target: torch.Tensor, weight=None) -> torch.Tensor:
    """Huber loss on standardised targets (quadratic within one standard deviation, linear past
    it): robust to the odd mislabelled number."""
    return nn.functional.huber_loss(out.float(), task.standardise(target))


def mse(task: Task, out: torch.Tensor, target: torch.Tensor, weight=None) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), task.standardise(target))


class Regression(Task):
    name = "regression"
    labels = "project.tasks.regression.labels:Numbers"
    answers = "project.tasks.regression.answers:Values"
    monitor, mode = "val/mae", "min"
    losses = {"huber": huber, "mse": mse}
    default_loss = "huber"
    train_metric_name = "train/mae"

    def __init__(self, names: list[str], loss: str | None = None, settings=None,
                 label_stats: dict | None = None) -> None:
        super().__init__(names, loss, settings, label_stats)
        n = len(names)
        self.mean = torch.tensor(self.label_stats.get("target_mean") or [0.0] * n, dtype=torch.float32)
        self.std = torch.tensor(self.label_stats.get("target_std") or [1.0] * n, dtype=torch.float32)

    @classmethod
    def summarise_labels(cls, targets: list, num_outputs: int) -> dict:
        values = torch.tensor(targets, dtype=torch.float64).reshape(-1, num_outputs)
        std = values.std(0, unbiased=False) if len(values) > 1 else torch.ones(num_outputs)
        return {"target_mean": values.mean(0).tolist(),
                "target_std": torch.where(std > 1e-12, std, torch.ones_like(std)).tolist()}

    @staticmethod
    def target(label: object) -> torch.Tensor:
        return torch.tensor(label, dtype=torch.float32)

    def check(self, hparams: dict) -> None:
        super().check(hparams)
        for key in ("class_weights", "label_smoothing"):
            if hparams.get(key):
                raise ConfigError(f"model.{key} is for classes; a regression learns numbers, got "
                                  f"{hparams[key]!r} (set it to null or 0)")

    def standardise(self, target: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(target.device), self.std.to(target.device)
        return (target.float().reshape(len(target), -1) - mean) / std

    def outputs(self, logits: torch.Tensor, temperature: torch.Tensor | float = 1.0) -> torch.Tensor:
        """The network's outputs in the targets' units (no temperature: nothing to calibrate)."""
        return logits.float() * self.std.to(logits.device) + self.mean.to(logits.device)

    def train_metric(self) -> Metric:
        return InUnits(MeanAbsoluteError(), self)

    def stage_metrics(self, stage: str) -> nn.Module:
        return RegressionStageMetrics(stage, self)

    @property
    def summary_metrics(self) -> list[str]:
        return ["val/mae_best", "val/mae", "val/rmse", "val/r2", "val/loss"]

    def describe(self) -> str:
        scaling = ", ".join(f"{n} {m:.4g} ± {s:.4g}" for n, m, s in
                            zip(self.names, self.mean.tolist(), self.std.tolist(), strict=True))
        return (f"Task: regression ({len(self.names)} output(s): {scaling} in training), {self.loss_name} "
                f"loss on standardised targets, best checkpoint by the lowest {self.monitor}")

    def state(self) -> dict:
        return {"target_mean": self.mean.tolist(), "target_std": self.std.tolist()}

    def export_score(self):
        def mae(out: torch.Tensor, target: torch.Tensor) -> float:
            return float((self.outputs(out) - target.reshape(len(target), -1)).abs().mean())
        return "val_mae", mae

    def log_views(self, writer, result, stage, step, epoch, top=5) -> None:
        pred, true = result.get(f"{stage}/predicted"), result.get(f"{stage}/true")
        if pred is not None and len(pred):
            figure = scatter_figure(pred, true, self.names, epoch)
            writer.add_figure(f"{stage}/predicted_vs_true", figure, step)

    def write_report(self, model, result, checkpoint: str, out_dir: Path, samples, dataset,
                     top: int, target_acc: float) -> dict:
        """report.md/json (MAE, RMSE, R² per output), the worst errors, residuals.png and
        mistakes.csv (every test image, largest error first)."""
        from project.common.files import atomic_path, write_text
        from project.extras.analysis.plots import save

        pred = self.outputs(samples["logits"]).double()
        true = samples["target"].double().reshape(len(pred), -1)
        paths = [dataset.samples[int(i)].path for i in samples["index"]]
        error = (pred - true).abs().max(1).values
        order = error.argsort(descending=True).tolist()
        outputs = {name: {"mae": float((pred[:, j] - true[:, j]).abs().mean()),
                          "rmse": float((pred[:, j] - true[:, j]).pow(2).mean().sqrt()),
                          "r2": r2(pred[:, j], true[:, j])} for j, name in enumerate(self.names)}
        rows = [{"path": paths[i], **{f"true_{n}": float(true[i, j]) for j, n in enumerate(self.names)},
                 **{f"predicted_{n}": float(pred[i, j]) for j, n in enumerate(self.names)},
                 "abs_error": float(error[i])} for i in order]
        report = {"checkpoint": checkpoint, "task": self.name, "images": len(paths),
                  **{k.split("/", 1)[1]: float(v) for k, v in result.items() if v.dim() == 0},
                  "outputs": outputs, "worst": rows[:top]}
        save(residual_figure(pred, true, self.names), out_dir / "residuals.png")
        with atomic_path(out_dir / "mistakes.csv") as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["path"])
            writer.writeheader()
            writer.writerows(rows)
        lines = [f"# Test report\n\nCheckpoint: `{checkpoint}`  \n"
                 f"Task: regression, {len(paths)} test images\n",
                 "| output | MAE | RMSE | R² |", "|---|---|---|---|"]
        lines += [f"| {n} | {o['mae']:.4f} | {o['rmse']:.4f} | {o['r2']:.4f} |" for n, o in outputs.items()]
        lines += ["\n## Largest errors\n", "| image | true | predicted | abs error |", "|---|---|---|---|"]
        for r in rows[:top]:
            true_, pred_ = ("; ".join(f"{r[kind + n]:.4g}" for n in self.names)
                            for kind in ("true_", "predicted_"))
            lines.append(f"| {r['path']} | {true_} | {pred_} | {r['abs_error']:.4g} |")
        lines += ["\n![residuals](residuals.png)\n", "Every test image, largest error first: mistakes.csv"]
        write_text(out_dir / "report.md", "\n".join(lines) + "\n")
        write_text(out_dir / "report.json", json.dumps(report, indent=2))
        print("\n".join(lines[1:3 + len(outputs)]))
        return report


class InUnits(Metric):
    """A torchmetrics metric fed the outputs in the targets' units; with several outputs, in
    training standard deviations (as the stage metrics' means)."""

    def __init__(self, metric: Metric, task: Regression) -> None:
        super().__init__()
        self.metric, self.task = metric, task

    def update(self, out: torch.Tensor, target: torch.Tensor) -> None:
        if len(self.task.names) > 1:
            self.metric.update(out.float(), self.task.standardise(target))
        else:
            self.metric.update(self.task.outputs(out), target.float().reshape(len(target), -1))

    def compute(self) -> torch.Tensor:
        return self.metric.compute()

    def reset(self) -> None:
        super().reset()
        self.metric.reset()


class RegressionStageMetrics(nn.Module):
    """What one stage measures, like ``StageMetrics``: MAE, RMSE and R² in the targets' units, and
    every prediction (the scatter plot). With several outputs each one's MAE and R² are logged in
    its units, and ``mae``/``rmse`` are the means in training standard deviations (the best
    checkpoint is picked on a sum of unlike units otherwise)."""

    def __init__(self, stage: str, task: Regression) -> None:
        super().__init__()
        self.stage, self.task = stage, task
        self.predicted, self.true, self.loss = CatMetric(), CatMetric(), MeanMetric()

    def update(self, out: torch.Tensor, target: torch.Tensor, loss: torch.Tensor) -> None:
        self.predicted.update(self.task.outputs(out))
        self.true.update(target.float().reshape(len(target), -1))
        self.loss.update(loss, len(target))

    def compute(self) -> dict[str, torch.Tensor]:
        n, s = len(self.task.names), self.stage
        pred = self.predicted.compute().reshape(-1, n).double()
        true = self.true.compute().reshape(-1, n).double()
        mae, rmse = (pred - true).abs().mean(0), (pred - true).pow(2).mean(0).sqrt()
        r2s = torch.tensor([r2(pred[:, j], true[:, j]) for j in range(n)], dtype=torch.float64)
        # several outputs: the means in training standard deviations, so kilograms do not drown counts
        scale = self.task.std.to(pred) if n > 1 else torch.ones(1, dtype=pred.dtype, device=pred.device)
        values = {f"{s}/mae": (mae / scale).mean(), f"{s}/rmse": (rmse / scale).mean(), f"{s}/r2": r2s.mean(),
                  f"{s}/loss": self.loss.compute(), f"{s}/predicted": pred, f"{s}/true": true}
        if n > 1:
            for j, name in enumerate(self.task.names):
                values.update({f"{s}/per_output/mae/{name}": mae[j], f"{s}/per_output/r2/{name}": r2s[j]})
        for metric in (self.predicted, self.true, self.loss):
            metric.reset()
        return {k: v.float() for k, v in values.items()}


def r2(pred: torch.Tensor, true: torch.Tensor) -> float:
    """The coefficient of determination (1: perfect; 0: no better than the mean; NaN: constant
    targets). By hand: torchmetrics' ``r2_score`` refuses a split of one image."""
    total = (true - true.mean()).pow(2).sum()
    return float(1 - (pred - true).pow(2).sum() / total) if total > 0 else float("nan")


def scatter_figure(pred: torch.Tensor, true: torch.Tensor, names: list[str], epoch: int | None = None):
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4.5), squeeze=False)
    for j, (ax, name) in enumerate(zip(axes[0], names, strict=True)):
        t, p = true[:, j].cpu().numpy(), pred[:, j].cpu().numpy()
        low, high = float(min(t.min(), p.min())), float(max(t.max(), p.max()))
        ax.scatter(t, p, s=10, alpha=0.6)
        ax.plot([low, high], [low, high], color="gray", linewidth=1)  # the perfect answers
        ax.set_xlabel(f"true {name}")
        ax.set_ylabel(f"predicted {name}")
        ax.set_title(f"{name}" + (f" (epoch {epoch})" if epoch is not None else ""))
    fig.tight_layout()
    return fig


def residual_figure(pred: torch.Tensor, true: torch.Tensor, names: list[str]):
    from matplotlib import pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(4.5 * len(names), 4), squeeze=False)
    for j, (ax, name) in enumerate(zip(axes[0], names, strict=True)):
        ax.scatter(true[:, j].numpy(), (pred[:, j] - true[:, j]).numpy(), s=10, alpha=0.6)
        ax.axhline(0, color="gray", linewidth=1)
        ax.set_xlabel(f"true {name}")
        ax.set_ylabel("predicted - true")
    fig.tight_layout()
    return fig
