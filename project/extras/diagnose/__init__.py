"""Diagnosis commands: single-batch overfit, LR and batch-size finders, data-folder scan."""
