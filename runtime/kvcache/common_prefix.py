"""The length of the common prefix of two token (or page id) sequences, at C speed.

The prefix cache compares prompts of thousands of tokens against tree keys and page lists on every admission,
insert and checkpoint; a Python loop over the tokens cost ~1 ms per 2000 (a visible share of a warm request's
TTFT). Slice comparisons run in C: one compares everything, and where the sequences differ a binary search over
slices finds the first difference in log2(n) comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int], a_start: int = 0) -> int:
    """Length of the common prefix of a[a_start:] and b (list or tuple slices, compared in C)."""
    hi = min(len(a) - a_start, len(b))
    if hi <= 0:
        return 0
    if _same(a, b, a_start, 0, hi):
        return hi
    lo = 0  # a[a_start:][:lo] == b[:lo] and they differ within [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _same(a, b, a_start, lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


def _same(a: Sequence[int], b: Sequence[int], a_start: int, lo: int, hi: int) -> bool:
    # A list and a tuple never compare equal as wholes: compare slices of the same type.
    left, right = a[a_start + lo : a_start + hi], b[lo:hi]
    if type(left) is not type(right):
        return list(left) == list(right)
    return left == right
