"""common_prefix_len (the prefix cache's C-speed token comparison) equals a token-by-token loop, for lists,
tuples and mixed pairs, from any start offset."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.kvcache.common_prefix import common_prefix_len


def _loop(a: list[int], b: list[int], start: int) -> int:
    n = 0
    while start + n < len(a) and n < len(b) and a[start + n] == b[n]:
        n += 1
    return n


tokens = st.lists(st.integers(0, 3), max_size=40)


@given(a=tokens, b=tokens, start=st.integers(0, 45), a_tuple=st.booleans(), b_tuple=st.booleans())
def test_equals_a_token_loop(a: list[int], b: list[int], start: int, a_tuple: bool, b_tuple: bool) -> None:
    left = tuple(a) if a_tuple else a
    right = tuple(b) if b_tuple else b
    assert common_prefix_len(left, right, start) == _loop(a, b, start)


def test_long_sequences_differing_anywhere() -> None:
    a = list(range(5000))
    for cut in (0, 1, 2047, 4999):
        b = a[:cut] + [-1] + a[cut + 1 :]
        assert common_prefix_len(a, b) == cut
        assert common_prefix_len(tuple(a), b) == cut
    assert common_prefix_len(a, a[:3000]) == 3000
