"""Comparing embedding vectors."""

from __future__ import annotations

import math

# An input embedded alone and in a chunk of others differs in its last bits at
# most (llama.cpp's kernels sum a row of one and a row of many in another
# order); different inputs differ in their first digits.
CLOSE = 1e-6


def vectors_close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < CLOSE


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
