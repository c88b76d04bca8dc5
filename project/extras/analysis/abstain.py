"""Abstain when unsure: the risk-coverage trade-off of the calibrated confidence on the test set,
and the confidence below which a deployed model should answer "unsure" to reach a target
accuracy on what it does answer (``serve``/``predict --min_confidence``).
"""

from __future__ import annotations

import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

COVERAGES = (1.0, 0.95, 0.9, 0.8, 0.7, 0.5)


def risk_coverage(probs: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(coverage, accuracy of the answered images, confidence threshold), answering the most
    confident images first: point k is the threshold of the k-th most confident image, and what
    that threshold answers (every image as confident, ties included)."""
    conf, pred = probs.double().max(-1)
    order = torch.argsort(conf, descending=True, stable=True)
    conf = conf[order]
    correct = (pred[order] == target[order]).double().cumsum(0)
    last = torch.searchsorted(-conf, -conf, right=True) - 1  # the last image at least as confident
    answered = (last + 1).double()
    return answered / len(order), correct[last] / answered, conf


def abstain_numbers(probs: torch.Tensor, target: torch.Tensor, target_acc: float) -> dict:
    """The curve at a few coverages, and the lowest confidence threshold whose answered images
    reach ``target_acc`` (the largest coverage that does; None when even the surest image alone
    falls short)."""
    coverage, accuracy, threshold = risk_coverage(probs, target)
    n = len(coverage)
    rows = [max(0, round(c * n) - 1) for c in COVERAGES]  # ties answer more: their coverage is shown
    table = [{"coverage": float(coverage[k]), "accuracy": float(accuracy[k]),
              "min_confidence": float(threshold[k])} for k in rows]
    ok = torch.nonzero(accuracy >= target_acc).flatten()
    best = None
    if len(ok):
        k = int(ok[-1])
        best = {"min_confidence": float(threshold[k]), "coverage": float(coverage[k]),
                "accuracy": float(accuracy[k])}
    return {"target_acc": target_acc, "at_target": best, "curve": table}


def risk_coverage_figure(probs: torch.Tensor, target: torch.Tensor, target_acc: float,
                         title: str = "test risk-coverage") -> Figure:
    coverage, accuracy, _ = risk_coverage(probs, target)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(coverage.numpy(), accuracy.numpy(), color="tab:blue", label="accuracy of the answered images")
    ax.axhline(target_acc, color="tab:red", linestyle="--", linewidth=1, label=f"target {target_acc:.3g}")
    ax.set(xlim=(0, 1.01), xlabel="coverage (share of images answered, most confident first)",
           ylabel="accuracy", title=title)
    ax.legend(loc="lower left")
    fig.tight_layout()
    return fig


def abstain_markdown(numbers: dict) -> list[str]:
    lines = ["## Abstaining when unsure", "", "Answering only the images whose calibrated confidence "
             "reaches a threshold (the rest: `unsure`):", "",
             "| coverage | accuracy of the answered | min confidence |", "|---|---|---|"]
    lines += [f"| {r['coverage']:.0%} | {r['accuracy']:.4f} | {r['min_confidence']:.4f} |"
              for r in numbers["curve"]]
    best, target = numbers["at_target"], numbers["target_acc"]
    lines += ["", f"Target accuracy {target:.3g}: " + (
        f"`--min_confidence {best['min_confidence']:.4f}` answers {best['coverage']:.1%} of the test images "
        f"at accuracy {best['accuracy']:.4f} (`make serve ARGS=\"--min_confidence ...\"`)." if best else
        "not reached at any coverage."), "", "![risk-coverage](risk_coverage.png)"]
    return lines
