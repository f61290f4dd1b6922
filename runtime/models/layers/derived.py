"""Tensors that depend only on parameters (Qwen3-Next's `1 + weight`, a mixer's `-exp(A_log)`, a depthwise conv's
[C, K] weight view), computed once and kept between eager forwards instead of re-dispatched every step: at
decode sizes each is a few microseconds of dispatch for no new information.

The cached value is remade when any source parameter's storage or version counter changes (loading, `cast`,
an in-place write), so it can never go stale. Inside a torch.compile trace the value is computed inline, as
before, so compiled graphs are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch

T = TypeVar("T")


def _version(t: torch.Tensor) -> int:
    # Inference tensors keep no version counter; they cannot be written outside inference mode either.
    return 0 if t.is_inference() else t._version  # noqa: SLF001 - torch has no public accessor for it


class Derived(Generic[T]):
    """`fn(*params)`, cached per the params' (data_ptr, version)."""

    def __init__(self, fn: Callable[..., T]) -> None:
        self.fn = fn
        self._key: tuple[tuple[int, int], ...] | None = None
        self._value: T | None = None

    def __call__(self, *params: torch.Tensor) -> T:
        if torch.compiler.is_compiling():
            return self.fn(*params)
        key = tuple((p.data_ptr(), _version(p)) for p in params)
        if self._value is None or key != self._key:
            # A plain tensor (not an inference one): usable in and out of inference mode.
            with torch.inference_mode(False), torch.no_grad():
                self._value = self.fn(*params)
            self._key = key
        return self._value


def one_plus(w: torch.Tensor) -> torch.Tensor:
    """A zero-centred norm weight's scale, in fp32."""
    return 1.0 + w.float()


def neg_exp(a_log: torch.Tensor) -> torch.Tensor:
    """A recurrent layer's decay rate `-exp(A_log)`, in fp32."""
    return -a_log.float().exp()


def depthwise_taps(weight: torch.Tensor) -> torch.Tensor:
    """A depthwise Conv1d weight [C, 1, K] as [C, K] (a view)."""
    return weight[:, 0, :]


def per_expert(stacked: torch.Tensor) -> Sequence[torch.Tensor]:
    """Stacked expert weights [E, ...] as E views: indexing the list is free, `stacked[e]` is a dispatched select."""
    return stacked.unbind(0)
