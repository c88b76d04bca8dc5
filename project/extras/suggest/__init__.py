"""Active learning: rank unlabeled images by how much a label would help, and put the labels a
person gives them into the labels table (``python -m project suggest``, docs/fewer-labels.md)."""
