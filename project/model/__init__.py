"""Model: the LightningModule, backbones and weights, metrics, learning-rate schedule."""

from project.model.classifier import ImageClassifier

__all__ = ["ImageClassifier"]
