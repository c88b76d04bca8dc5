"""Embeddings once: the cache of a network's penultimate features, and the tools that read it."""
