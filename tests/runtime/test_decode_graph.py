"""The decode step of every family, at batch 1 and 8, is one static graph, as a CUDA graph needs it: torch.compile
with `fullgraph=True, dynamic=False` traces `decode_step` (runtime/engine/compiled_decode.py) whole, on the path an
accelerator takes, with no host read inside. A `.tolist()` or a branch on a tensor's value anywhere in the step ends
the graph (fullgraph makes that an error); an `.item()` or a value-sized op (boolean indexing) is captured into it as
a symbol, which the check refuses (the last test shows the check catches each).

The graph is then replayed the way a CUDA graph is: its input tensors (token ids, positions, KV slots, state slots,
the KV gather index padded to one width, its mask) are allocated once and refilled in place for each of several
successive steps. Every replay must compute the eager step's logits and leave the pools as the eager step leaves
them, with no second graph compiled (no guard on a value or on a length that changes between steps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend

from runtime.core.batch import PoolBuffers
from runtime.core.device_path import rehearse_accelerator_path
from runtime.engine.compiled_decode import DecodeInputs, decode_step
from runtime.models import load_model
from runtime.models.base import HybridModel
from runtime.models.decoder import DecoderLM
from tests.runtime.simple_runner import SimpleRunner
from tests.runtime.test_engine_support import one_torch_thread, perturb_weights

transformers = pytest.importorskip("transformers")
from tests.runtime.test_model_reference import ARCHS, VOCAB  # noqa: E402 - needs transformers

pytestmark = pytest.mark.slow  # a compile per family and batch: ~2 minutes on a busy 2-core host

WIDTH = 32  # the KV bucket: every step's gather index is padded to this many token slots
STEPS = 3  # successive decode steps replayed over the same input tensors


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield


@pytest.fixture(scope="module", params=sorted(ARCHS))
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> HybridModel:
    torch.manual_seed(0)
    hf: Any = ARCHS[request.param][0]()  # a transformers model (save_pretrained)
    perturb_weights(hf.eval(), 1)
    path = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(path)
    return load_model(path)


# Builds the step to replay over the static inputs and pools it is given (compiling or capturing it), and returns
# a call that runs it once over their current contents.
StepMaker = Callable[[DecodeInputs, PoolBuffers], Callable[[], torch.Tensor]]


class StaticInputs:
    """The step's input tensors for one (batch, KV width) bucket, allocated once and refilled in place."""

    def __init__(self, batch: int, device: torch.device) -> None:
        with torch.inference_mode():  # as the engine passes them (compile_support.as_traced)
            rows = torch.zeros(batch, dtype=torch.int64, device=device)
            self.tensors = DecodeInputs(
                input_ids=rows.clone(),
                positions=rows.clone(),
                out_locs=rows.clone(),
                state_slots=rows.clone(),
                kv_index=torch.zeros(batch, WIDTH, dtype=torch.int64, device=device),
                kv_mask=torch.zeros(batch, 1, 1, WIDTH, dtype=torch.bool, device=device),
            )

    def fill(self, runner: SimpleRunner, seq_ids: list[int]) -> None:
        """The decode step `runner` just ran over `seq_ids` (their last token is the step's input); padding
        entries repeat the sequence's first slot and are masked."""
        seqs = [runner.seqs[s] for s in seq_ids]
        assert all(len(seq.kv_locs) <= WIDTH for seq in seqs)
        index = [seq.kv_locs + [seq.kv_locs[0]] * (WIDTH - len(seq.kv_locs)) for seq in seqs]
        lens = torch.tensor([len(seq.kv_locs) for seq in seqs])
        t = self.tensors
        with torch.inference_mode():
            t.input_ids.copy_(torch.tensor([seq.tokens[-1] for seq in seqs]))
            t.positions.copy_(lens - 1)
            t.out_locs.copy_(torch.tensor([seq.kv_locs[-1] for seq in seqs]))
            t.state_slots.copy_(torch.tensor([seq.slot for seq in seqs]))
            t.kv_index.copy_(torch.tensor(index))
            t.kv_mask.copy_((torch.arange(WIDTH)[None, :] < lens[:, None])[:, None, None, :])


def clone_pools(buffers: PoolBuffers) -> PoolBuffers:
    return PoolBuffers(*([t.clone() for t in group] for group in (buffers.k, buffers.v, buffers.conv, buffers.ssm)))


def _prefilled(model: HybridModel, batch: int) -> tuple[SimpleRunner, list[int]]:
    """`batch` sequences with ragged prompts (3, 5, 7, ... tokens), prefilled eagerly; returns the runner and each
    sequence's greedy next token. State slot 0 is taken and the batch's rows hold slots batch..1 (reversed), so a
    step that read the state of row i from slot i would read another sequence's."""
    runner = SimpleRunner(model, num_token_slots=batch * WIDTH, num_state_slots=batch + 1)
    runner.add(-1)
    for s in reversed(range(batch)):
        runner.add(s)
    g = torch.Generator().manual_seed(batch)
    logits = runner.extend({s: torch.randint(0, VOCAB, (3 + 2 * s,), generator=g).tolist() for s in range(batch)})
    return runner, logits.argmax(-1).tolist()


def replay_decode(model: HybridModel, batch: int, make_step: StepMaker) -> list[str]:
    """STEPS successive decode steps of `batch` sequences, each run eagerly (unpadded, the engine's way) and by the
    step `make_step` builds over one set of static inputs refilled in place and a twin of the pools; returns
    where the two differ (logits or any pool after a step), empty when they agree within fp32 tolerance."""
    runner, tokens = _prefilled(model, batch)
    twin = clone_pools(runner.buffers)  # the replayed step's pools
    inputs = StaticInputs(batch, runner.device)
    seq_ids = list(range(batch))
    run: Callable[[], torch.Tensor] | None = None
    differences: list[str] = []
    for step in range(STEPS):
        eager = runner.extend({s: [tokens[s]] for s in seq_ids})
        inputs.fill(runner, seq_ids)
        run = run or make_step(inputs.tensors, twin)
        with torch.inference_mode():
            replayed = run()
        pairs = [("logits", replayed, eager)]
        for kind in ("k", "v", "conv", "ssm"):
            pairs += [
                (f"{kind}[{i}]", mine, theirs)
                for i, (mine, theirs) in enumerate(zip(getattr(twin, kind), getattr(runner.buffers, kind), strict=True))
            ]
        for what, mine, theirs in pairs:
            try:
                torch.testing.assert_close(mine, theirs)
            except AssertionError as exc:
                differences.append(f"step {step}, {what}: {str(exc).splitlines()[0]}")
        tokens = eager.argmax(-1).tolist()
    return differences


class GraphCheck:
    """A dynamo backend that records what makes a decode graph uncapturable, then runs the graph through `backend`
    (aot_eager: functionalized as inductor's would be, in-place pool writes included, without inductor's compile
    time). With static shapes a symbol in the graph can only be a value read from a tensor: torch captures
    `.item()` and value-sized ops (boolean indexing, `nonzero`) into the graph as unbacked symbols rather than
    ending it, and each is a host sync there."""

    def __init__(self, backend: str = "aot_eager") -> None:
        self.backend = backend
        self.graphs = 0
        self.host_reads: list[str] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable[..., Any]:
        self.graphs += 1
        self.host_reads += [n.format_node() for n in gm.graph.nodes if _symbolic(n.meta.get("example_value"))]
        return lookup_backend(self.backend)(gm, example_inputs)

    def compile(self, model: HybridModel) -> Callable[..., torch.Tensor]:
        return torch.compile(decode_step(model), fullgraph=True, dynamic=False, backend=self)

    def step_maker(self, model: HybridModel) -> StepMaker:
        """The compiled step, traced on the accelerator path, as `replay_decode` runs it."""
        compiled = self.compile(model)

        def make(inputs: DecodeInputs, buffers: PoolBuffers) -> Callable[[], torch.Tensor]:
            def run() -> torch.Tensor:
                with rehearse_accelerator_path():
                    return compiled(*inputs, buffers)

            return run

        return make


def _symbolic(value: object) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    return isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in value.shape)


@pytest.mark.parametrize("batch", [1, 8])
def test_decode_step_is_one_graph_replayed_over_refilled_inputs(family: HybridModel, batch: int) -> None:
    torch._dynamo.reset()
    check = GraphCheck()
    assert replay_decode(family, batch, check.step_maker(family)) == []
    assert check.host_reads == [], "host reads inside the decode graph:\n" + "\n".join(check.host_reads[:5])
    assert check.graphs == 1, f"{check.graphs} graphs for one bucket: a recompile"


def _break_in_the_first_layer(model: HybridModel, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Make the first decoder layer of `model` do what a graph cannot hold."""
    assert isinstance(model, DecoderLM)
    layer = model.body.layers[0]
    forward = layer.forward

    def broken(x: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if kind == "item":
            x = x * (1.0 + 0.0 * x.abs().max().item())
        elif kind == "tolist":
            x = x + 0.0 * torch.tensor(x.flatten()[:1].tolist())
        elif kind == "bool_index":
            x = x + 0.0 * x[x > 0].sum()
        elif x.sum() > float("inf"):  # a branch on a value
            x = -x
        return forward(x, *args, **kwargs)

    monkeypatch.setattr(layer, "forward", broken)


@pytest.mark.parametrize("family", ["qwen3_next"], indirect=True)  # the check's own test: one family is enough
@pytest.mark.parametrize("kind", ["item", "tolist", "bool_index", "branch"])
def test_a_host_read_in_the_step_fails_the_check(
    family: HybridModel, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    torch._dynamo.reset()
    runner, _ = _prefilled(family, 1)
    inputs = StaticInputs(1, runner.device)
    runner.extend({0: [1]})
    inputs.fill(runner, [0])
    _break_in_the_first_layer(family, monkeypatch, kind)
    check = GraphCheck()
    with torch.inference_mode(), rehearse_accelerator_path():
        try:
            check.compile(family)(*inputs.tensors, runner.buffers)
        except torch._dynamo.exc.Unsupported:
            return  # fullgraph: the graph would have ended here
        finally:
            torch._dynamo.reset()
    assert check.host_reads, f"{kind} in the step went unnoticed"
