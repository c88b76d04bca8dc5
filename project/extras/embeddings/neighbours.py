"""Exact cosine neighbours of embeddings, in blocks of matrix products (no all-pairs loop, no index
library): near-duplicate pairs, each image's likeness to its class, and the closest classes."""

from __future__ import annotations

import numpy as np

MAX_PAIRS = 100_000  # a threshold so low that more pairs pass says so rather than filling memory


def normalised(features: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1: their dot products are cosine similarities."""
    x = np.asarray(features, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def near_pairs(features: np.ndarray, threshold: float, block: int = 2048,
               limit: int = MAX_PAIRS) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """(i, j, similarity, truncated) of every pair i < j with cosine similarity >= ``threshold``,
    closest first; at most ``limit`` pairs (the closest), ``truncated`` when more passed."""
    x = normalised(features)
    found_i, found_j, found_s = [], [], []
    count = 0
    for start in range(0, len(x), block):
        sims = x[start:start + block] @ x.T
        rows, cols = np.nonzero(sims >= threshold)
        keep = cols > rows + start  # each pair once, never an image with itself
        rows, cols = rows[keep], cols[keep]
        found_i.append(rows + start)
        found_j.append(cols)
        found_s.append(sims[rows, cols])
        count += len(rows)
    if not count:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0, dtype=np.float32), False
    i, j, s = np.concatenate(found_i), np.concatenate(found_j), np.concatenate(found_s)
    order = np.argsort(-s, kind="stable")[:limit]
    return i[order], j[order], s[order], count > limit


def class_centroids(features: np.ndarray, labels: list[str]) -> tuple[list[str], np.ndarray]:
    """(class names, their unit-length mean embeddings), from the unit-length embeddings."""
    x = normalised(features)
    names = sorted(set(labels))
    index = {n: k for k, n in enumerate(names)}
    which = np.array([index[label] for label in labels])
    sums = np.zeros((len(names), x.shape[1]), dtype=np.float64)
    np.add.at(sums, which, x)
    return names, normalised(sums)


def likeness_to_class(features: np.ndarray, labels: list[str]) -> np.ndarray:
    """Each image's cosine similarity to its own class's centroid: the lowest are the outliers."""
    names, centroids = class_centroids(features, labels)
    index = {n: k for k, n in enumerate(names)}
    which = np.array([index[label] for label in labels])
    return np.einsum("nd,nd->n", normalised(features), centroids[which])


def look_alike_classes(features: np.ndarray, labels: list[str]) -> list[tuple[str, str, float]]:
    """Class pairs by the cosine similarity of their centroids, closest first."""
    names, centroids = class_centroids(features, labels)
    sims = centroids @ centroids.T
    a, b = np.triu_indices(len(names), 1)
    order = np.argsort(-sims[a, b], kind="stable")
    return [(names[a[k]], names[b[k]], float(sims[a[k], b[k]])) for k in order]
