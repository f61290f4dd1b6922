"""Host weights in one huge-page block (runtime/models/weight_arena.py): the same values as separate allocations,
each parameter a cache-line-aligned, non-overlapping view of the block, and huge pages where the kernel offers them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from runtime.demo_model import build_demo_model
from runtime.models import load_model
from runtime.models.weight_arena import HUGE_PAGE, WeightArena, thp_mode


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("arena") / "demo")


def _huge_kib_at(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (/proc/self/smaps): the block's own huge pages, whatever
    other tests allocate or free meanwhile."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and not line.endswith(":") and ":" not in head:
            lo, hi = (int(part, 16) for part in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_arena_holds_the_same_weights_as_separate_allocations(demo_dir: Path, dtype: torch.dtype) -> None:
    arena_model = load_model(demo_dir, dtype=dtype)
    plain_model = load_model(demo_dir, dtype=dtype, huge_pages=False)
    arena = arena_model.weight_arena
    assert arena is not None and plain_model.weight_arena is None
    start = arena.block.data_ptr() + arena.shift
    assert start % HUGE_PAGE == 0
    spans = []
    plain = dict(plain_model.named_parameters())
    for name, param in arena_model.named_parameters():
        assert torch.equal(param, plain[name]), name
        assert param.dtype == plain[name].dtype and param.is_contiguous()
        lo = param.data_ptr()
        assert lo % 64 == 0, name
        assert start <= lo and lo + param.nbytes <= start + arena.nbytes, name
        spans.append((lo, lo + param.nbytes))
    spans.sort()
    assert all(a_end <= b_lo for (_, a_end), (b_lo, _) in zip(spans, spans[1:], strict=False))


def test_arena_views_do_not_overlap_and_keep_their_shapes() -> None:
    shapes = [(3, 5), (7,), (0,), (2, 2, 9)]
    dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float32]
    arena = WeightArena(
        [
            int(torch.Size(s).numel()) * torch.empty((), dtype=d).element_size()
            for s, d in zip(shapes, dtypes, strict=True)
        ]
    )
    views = [arena.tensor(i, torch.Size(s), d) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))]
    for i, v in enumerate(views):
        assert tuple(v.shape) == shapes[i] and v.dtype == dtypes[i]
        v.fill_(i + 1)
    for i, v in enumerate(views):
        assert bool((v == i + 1).all())


@pytest.mark.skipif(thp_mode() not in ("madvise", "always"), reason="the kernel offers no transparent huge pages")
def test_weights_land_on_huge_pages(tmp_path: Path) -> None:
    # 8 MiB of parameters at least, so that whole 2 MiB pages lie inside the block.
    directory = build_demo_model(tmp_path / "demo")
    model = load_model(directory)
    arena = model.weight_arena
    assert arena is not None and arena.huge
    start = arena.block.data_ptr() + arena.shift
    if arena.nbytes >= 4 * HUGE_PAGE:
        assert _huge_kib_at(start) >= HUGE_PAGE // 1024
