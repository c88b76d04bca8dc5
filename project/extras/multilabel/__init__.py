"""Multi-label classification: see project/extras/multilabel/task.py."""
