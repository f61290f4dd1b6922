"""PageList (runtime/kvcache/page_list.py): a request's page list whose int64 tensor copy is kept up to date
incrementally. Whatever is done to the list — the mutations the cache manager and spec decoding do, and any
other list method — `as_tensor(n)` must equal the list's first n entries, and a tensor handed out earlier must
keep showing what it showed."""

from __future__ import annotations

import random

import pytest
import torch

from runtime.kvcache.cache_manager import ReqMemory
from runtime.kvcache.page_list import PageList


def _op(rng: random.Random, pages: PageList, ref: list[int]) -> None:
    n = len(ref)
    kind = rng.choice(["append", "extend", "setslice", "setslice_same", "truncate", "setitem", "del", "misc"])
    if kind == "append":
        v = rng.randrange(10_000)
        pages.append(v)
        ref.append(v)
    elif kind == "extend":
        vs = [rng.randrange(10_000) for _ in range(rng.randrange(1, 9))]
        pages.extend(vs)
        ref.extend(vs)
    elif kind == "setslice" and n:  # the prefix cache swapping in its pages for duplicates
        k = rng.randrange(n + 1)
        new = [v if rng.random() < 0.7 else rng.randrange(10_000) for v in ref[:k]]
        pages[:k] = new
        ref[:k] = new
    elif kind == "setslice_same" and n:
        k = rng.randrange(n + 1)
        pages[:k] = list(ref[:k])
    elif kind == "truncate" and n:  # spec decoding's rollback
        k = rng.randrange(n + 1)
        del pages[k:]
        del ref[k:]
    elif kind == "setitem" and n:
        i, v = rng.randrange(-n, n), rng.randrange(10_000)
        pages[i] = v
        ref[i] = v
    elif kind == "del" and n:
        i = rng.randrange(n)
        del pages[i]
        del ref[i]
    elif kind == "misc" and n:
        name = rng.choice(["insert", "pop", "remove", "reverse", "sort", "iadd"])
        if name == "insert":
            i, v = rng.randrange(n + 1), rng.randrange(10_000)
            pages.insert(i, v)
            ref.insert(i, v)
        elif name == "pop":
            assert pages.pop() == ref.pop()
        elif name == "remove":
            v = rng.choice(ref)
            pages.remove(v)
            ref.remove(v)
        elif name == "reverse":
            pages.reverse()
            ref.reverse()
        elif name == "sort":
            pages.sort()
            ref.sort()
        else:
            pages += [7, 8]
            ref += [7, 8]


@pytest.mark.parametrize("seed", range(6))
def test_tensor_copy_follows_every_mutation(seed: int) -> None:
    rng = random.Random(seed)
    pages, ref = PageList(), []
    handed: list[tuple[torch.Tensor, list[int]]] = []
    for _ in range(3000):
        _op(rng, pages, ref)
        assert list(pages) == ref
        if ref and rng.random() < 0.6:
            n = rng.randrange(len(ref) + 1)
            t = pages.as_tensor(n)
            assert t.dtype == torch.int64 and t.tolist() == ref[:n]
            handed.append((t, ref[:n]))
    for t, seen in handed:
        assert t.tolist() == seen, "a tensor handed out earlier changed"


def test_req_memory_pages_is_always_a_page_list() -> None:
    mem = ReqMemory(pages=[3, 4, 5])
    assert isinstance(mem.pages, PageList) and mem.pages.as_tensor(3).tolist() == [3, 4, 5]
    mem.pages = mem.pages[:1]  # slicing gives a plain list; assigning it back wraps it
    assert isinstance(mem.pages, PageList) and mem.pages.as_tensor(1).tolist() == [3]
    assert isinstance(ReqMemory().pages, PageList)
