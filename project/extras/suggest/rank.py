"""Which unlabeled images to label next: each strategy orders the pool, best first.

A strategy is one function ``(pool, n, seed) -> [(index into the pool, score), ...]`` (the first
``n``, best first) and one line in :data:`STRATEGIES`. Those that need the class probabilities
of a one-class-per-image model say so with :func:`needs_probabilities`, so a multi-label or
regression checkpoint is refused before any image is read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from project.errors import ProjectError
from project.extras.suggest.pool import Pool, embed_pool

Ranking = list[tuple[int, float]]
CANDIDATES_PER_PICK = 10  # margin-kcenter: k-center among the 10 x n least certain images ...
CANDIDATE_SHARE = 0.5  # ... at most the less certain half of the pool, so the margin always narrows


def needs_probabilities(fn: Callable[[Pool, int, int], Ranking]) -> Callable[[Pool, int, int], Ranking]:
    fn.needs_probabilities = True  # type: ignore[attr-defined]
    return fn


def margins(pool: Pool) -> torch.Tensor:
    """Top-1 minus top-2 probability: near 0 where the model cannot choose between two classes."""
    top = pool.probs.topk(min(2, pool.probs.shape[1]), dim=1).values
    return top[:, 0] - top[:, 1] if top.shape[1] > 1 else torch.ones(len(top))


def ascending(values: torch.Tensor, n: int) -> Ranking:
    """The ``n`` smallest values first; ties keep the pool's (path) order."""
    order = torch.sort(values, stable=True).indices[:n].tolist()
    return [(i, float(values[i])) for i in order]


@needs_probabilities
def margin(pool: Pool, n: int, seed: int) -> Ranking:
    """Smallest gap between the two most likely classes first (score: the gap)."""
    return ascending(margins(pool), n)


@needs_probabilities
def entropy(pool: Pool, n: int, seed: int) -> Ranking:
    """Highest entropy of the class probabilities first (score: the entropy, in nats)."""
    p = pool.probs.double().clamp_min(1e-12)
    h = -(pool.probs.double() * p.log()).sum(1)
    return [(i, -s) for i, s in ascending(-h, n)]


def k_center_greedy(x: torch.Tensor, n: int, labeled: torch.Tensor | None = None) -> Ranking:
    """Greedy k-center (Sener & Savarese, 2018): each pick is the point farthest from every point
    picked so far and from ``labeled``; score: that distance when picked. Without labeled points
    the first pick is the one farthest from the mean."""
    x = x.double()
    if labeled is not None and len(labeled):
        nearest = torch.cat([torch.cdist(chunk, labeled.double()).min(1).values
                             for chunk in x.split(4096)])
    else:
        nearest = torch.cdist(x, x.mean(0, keepdim=True))[:, 0]
    picks: Ranking = []
    for _ in range(min(n, len(x))):
        i = int(nearest.argmax())  # the first of equals: the pool's order
        picks.append((i, float(nearest[i])))
        nearest = torch.minimum(nearest, torch.cdist(x, x[i:i + 1])[:, 0])
        nearest[i] = -1.0  # never again (a duplicate of it is at distance 0, not below)
    return picks


def k_center(pool: Pool, n: int, seed: int) -> Ranking:
    """Diversity: the images farthest from the labeled ones and from each other."""
    return k_center_greedy(pool.embeddings, n, pool.labeled)


def candidate_count(pool_size: int, n: int) -> int:
    """How many of the least certain images margin-kcenter spreads its ``n`` picks over: ``10 x n``,
    but at most half the pool (else on a small pool every image is a candidate and the margin
    plays no part) and never fewer than ``n``."""
    return max(n, min(CANDIDATES_PER_PICK * n, int(pool_size * CANDIDATE_SHARE)))


@needs_probabilities
def margin_kcenter(pool: Pool, n: int, seed: int) -> Ranking:
    """Uncertain and diverse: k-center among the :func:`candidate_count` smallest-margin images,
    so a cluster of near-identical uncertain images gives one pick, not ten (score: the margin)."""
    m = margins(pool)
    candidates = [i for i, _ in ascending(m, candidate_count(len(pool), n))]
    picks = k_center_greedy(pool.embeddings[candidates], n, pool.labeled)
    return [(candidates[j], float(m[candidates[j]])) for j, _ in picks]


def random_order(pool: Pool, n: int, seed: int) -> Ranking:
    """The baseline every other strategy must beat: a seeded shuffle (score: the random key)."""
    keys = torch.from_numpy(np.random.default_rng(seed).random(len(pool)))
    return ascending(keys, n)


STRATEGIES: dict[str, Callable[[Pool, int, int], Ranking]] = {
    "margin-kcenter": margin_kcenter,
    "margin": margin,
    "entropy": entropy,
    "k-center": k_center,
    "random": random_order,
}


def check_strategy(strategy: str, model=None) -> Callable[[Pool, int, int], Ranking]:
    """The strategy's function; one error naming ``--strategy`` and the choices, or what the
    checkpoint's task cannot give."""
    if strategy not in STRATEGIES:
        raise ProjectError(f"--strategy '{strategy}' is unknown; choose from {', '.join(STRATEGIES)}")
    fn = STRATEGIES[strategy]
    if model is not None and getattr(fn, "needs_probabilities", False) and not model.task.gives_probabilities:
        raise ProjectError(f"--strategy {strategy} ranks by the class probabilities of a model with one "
                           f"class per image; this checkpoint's task is {model.task.name}: use "
                           "--strategy k-center or random")
    return fn


def rank_pool(pool: Pool, strategy: str = "margin-kcenter", n: int = 100, seed: int = 0) -> list[dict]:
    """Rows ``{image, suggested, score, rank}``, best first, at most ``n``."""
    fn = check_strategy(strategy)
    if n < 1:
        raise ProjectError(f"--n must be 1 or more, got {n}")
    if getattr(fn, "needs_probabilities", False) and pool.probs is None:
        raise ProjectError(f"--strategy {strategy} needs class probabilities, which a {pool.task} "
                           "model does not give: use --strategy k-center or random")
    return [{"image": pool.paths[i], "suggested": pool.suggested(i), "score": score, "rank": r}
            for r, (i, score) in enumerate(fn(pool, n, seed), start=1)]


def rank_images(model, paths: list[str], strategy: str = "margin-kcenter", n: int = 100,
                batch_size: int = 64, seed: int = 0, labeled_paths: list[str] | None = None,
                device: str | None = None, num_workers: int = 0) -> list[dict]:
    """The ``n`` images of ``paths`` most worth labeling, as rows ``{image, suggested, score,
    rank}``, best first (undecodable files are left out). ``labeled_paths``: images already
    labeled, which k-center keeps away from. ``device`` None: where the model is."""
    check_strategy(strategy, model)
    if n < 1:
        raise ProjectError(f"--n must be 1 or more, got {n}")
    device = device or str(next(model.parameters()).device)
    pool = embed_pool(model, paths, batch_size, device, num_workers, labeled_paths)
    return rank_pool(pool, strategy, n, seed)
