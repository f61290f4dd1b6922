"""Load an HF model directory (config.json + *.safetensors, sharded or not) into our own model classes."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open

from runtime.models.base import HybridModel
from runtime.models.errors import ModelLoadError
from runtime.models.hf_config import HFConfig
from runtime.models.quantized import SCALE_SUFFIX, Fp8Blocks, checkpoint_quantization, is_fp8
from runtime.models.registry import resolve
from runtime.models.weight_arena import WeightArena

# Non-parameter tensors some exporters write; they are recomputed, never read.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# The initialisers a module's reset_parameters calls; on the meta device they compute nothing, and `normal_` (every
# nn.Embedding) runs as a Python reference that imports torch._dynamo: ~800 modules, ~75 MB resident for good.
_INITIALISERS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "zeros_", "ones_", "constant_")  # fmt: skip


@contextmanager
def _no_init() -> Iterator[None]:
    """torch.nn.init's initialisers as no-ops (the model is built on meta and every value comes from the checkpoint)."""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    try:
        for name in saved:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)


def read_config(model_path: Path) -> HFConfig:
    path = model_path / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{path}: not found. Point the runtime at an HF model directory that has config.json.")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc}); fix or re-download the file.") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object at the top level; fix or re-download the file.")
    return HFConfig(data, path)


def _tensor_files(model_path: Path) -> dict[str, Path]:
    """Tensor name → the .safetensors file holding it (from the shard index when there is one)."""
    index = model_path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{index}: no valid 'weight_map' ({exc}); fix or re-download the file.") from exc
        files = {name: model_path / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise ModelLoadError(f"{index}: lists shard {shard.name}, which is missing; download it again.")
        return files
    shards = sorted(model_path.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{model_path}: no *.safetensors files; the runtime loads safetensors weights only.")
    files = {}
    for shard in shards:
        for name in _shard_names(shard):
            files[name] = shard
    return files


def _shard_names(shard: Path) -> list[str]:
    try:
        with safe_open(str(shard), framework="pt") as f:
            return list(f.keys())
    except Exception as exc:  # safetensors raises its own error types for truncated or foreign files
        raise ModelLoadError(f"{shard}: not a readable safetensors file ({exc}); download it again.") from None


def _eos_ids(model_path: Path, cfg: HFConfig) -> tuple[int, ...]:
    ids = list(cfg.eos_token_ids())
    gen = model_path / "generation_config.json"
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{gen}: not valid JSON ({exc}); fix or delete the file.") from exc
        for token in eos if isinstance(eos, list) else [eos] if eos is not None else []:
            if token not in ids:
                ids.append(int(token))
    return tuple(ids)


def load_model(
    model_path: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu", huge_pages: bool = True
) -> HybridModel:
    """Build the model class for `model_path`'s config.json and fill every parameter from its safetensors.
    `huge_pages`: host parameters live in one block backed by transparent huge pages where the kernel offers
    them (runtime/models/weight_arena.py); off, each is its own allocation."""
    model_path = Path(model_path)
    cfg = read_config(model_path)
    entry = resolve(cfg)
    fp8 = checkpoint_quantization(cfg)  # refused here, before any memory, when it is not one the loader reads
    # Built on the meta device: no random init, no memory until the checkpoint fills each parameter.
    with torch.device("meta"), _no_init():
        try:
            model = entry.build(cfg)
        except ModelLoadError:
            raise
        except (TypeError, ValueError, KeyError, ZeroDivisionError, RuntimeError) as exc:
            # Inconsistent numbers (heads that do not divide, lists of the wrong type) surface here.
            raise ModelLoadError(
                f"{cfg.path}: does not describe a valid {cfg.data.get('model_type')} model ({exc!r}); "
                "fix the file or re-download the model."
            ) from None
    # Cast while still on meta so real memory is allocated once, at the target dtype.
    with weights_fit(torch.device(device)):
        model = _materialize(model.cast(dtype), torch.device(device), huge_pages)
        files = _tensor_files(model_path)
        _fill_parameters(model, files, dtype, torch.device(device), fp8)
        for module in model.modules():  # layers that re-lay their weights for serving once they hold real values
            hook = getattr(module, "after_weights_loaded", None)
            if callable(hook):
                hook()
    model.eos_token_ids = _eos_ids(model_path, cfg)
    _return_freed_heap()
    # Serving only: no forward should record an autograd graph, whether or not its caller is in inference mode
    # (the kernels write into preallocated outputs, which autograd refuses).
    return model.eval().requires_grad_(False)


def _return_freed_heap() -> None:
    """Give the heap's free pages back to the OS once the weights are in place. The runtime keeps freed heap
    memory for the next forward (runtime/__init__.py: no trimming below 1 GiB), so the checkpoint tensors the
    load read and dropped would otherwise stay resident next to the weights for good. glibc only."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return  # not glibc: its allocator returns memory by its own rules
    trim(0)


@contextmanager
def weights_fit(device: torch.device) -> Iterator[None]:
    """An allocation failure while the weights load becomes a ModelLoadError that says what to change: CUDA's
    torch.OutOfMemoryError, and the CPU allocator's RuntimeError (the weights alone exceed the device)."""
    try:
        yield
    except torch.OutOfMemoryError as exc:
        raise ModelLoadError(
            f"out of memory on {device} while loading the weights ({str(exc).splitlines()[0]}). The weights alone do "
            "not fit its free memory; --mem-fraction-static sizes the cache pools after the weights and cannot make "
            "room for them. Free the GPU (other processes may hold memory), load an FP8 block-quantized checkpoint, "
            "or split the model over several GPUs with tensor parallelism (TP) in SGLang "
            "(hybridctl init --engine sglang); the bundled runtime runs on one device."
        ) from None
    except RuntimeError as exc:
        if "can't allocate memory" not in str(exc):
            raise
        raise ModelLoadError(
            f"out of memory on {device} while loading the weights ({str(exc).splitlines()[0]}); the weights alone "
            "do not fit this host's memory. Use a smaller model, an FP8 block-quantized checkpoint, or a GPU "
            "server with SGLang (hybridctl init --engine sglang)."
        ) from None


def _materialize(model: HybridModel, device: torch.device, huge_pages: bool) -> HybridModel:
    """`model.to_empty(device)` without its Python `empty_like` reference, which imports torch's symbolic shapes
    and sympy (~40 MB resident) for meta tensors; `torch.empty` of each shape is the same uninitialised memory.
    On the host the parameters share one huge-page block (`huge_pages`), still untouched here."""
    owned = [
        (module, name, param) for module in model.modules() for name, param in module.named_parameters(recurse=False)
    ]
    arena = (
        WeightArena([p.numel() * p.element_size() for _, _, p in owned])
        if device.type == "cpu" and huge_pages
        else None
    )
    model.weight_arena = arena
    for index, (module, name, param) in enumerate(owned):
        if arena is not None:
            fresh = arena.tensor(index, param.shape, param.dtype)
        else:
            fresh = torch.empty(param.shape, dtype=param.dtype, device=device)
        setattr(module, name, torch.nn.Parameter(fresh, requires_grad=param.requires_grad))
    for module in model.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            setattr(module, name, torch.empty(buf.shape, dtype=buf.dtype, device=device))
    return model


def _checkpoint_names(model: HybridModel, files: dict[str, Path]) -> dict[str, tuple[str, Path]]:
    """Model-side name → (name stored in the checkpoint, file), after dropping ignored tensors and applying
    the model's prefix renames."""
    ignored = model.ignored_weight_prefixes()
    renames = model.checkpoint_prefix_renames()
    names: dict[str, tuple[str, Path]] = {}
    for stored, path in files.items():
        if ignored and stored.startswith(ignored):
            continue
        name = stored
        for old, new in renames.items():
            if stored.startswith(old):
                name = new + stored[len(old) :]
                break
        names[name] = (stored, path)
    return names


def _fill_parameters(
    model: HybridModel, files: dict[str, Path], dtype: torch.dtype, device: torch.device, fp8: Fp8Blocks | None
) -> None:
    names = _checkpoint_names(model, files)
    # An FP8 weight's block scales are read with the weight (`read`), not as parameters of their own.
    scales = {n for n in names if fp8 is not None and n.endswith(SCALE_SUFFIX) and n[: -len(SCALE_SUFFIX)] in names}
    sources = model.checkpoint_sources()
    aliases = model.checkpoint_aliases()
    extra_prefixes = model.extra_weight_prefixes()
    plan: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        if name in names:
            plan[name] = [name]
        elif name in sources and all(s in names for s in sources[name]):
            plan[name] = sources[name]
        elif name in aliases and aliases[name] in names:
            plan[name] = [aliases[name]]
        else:
            wanted = sources.get(name, [name])
            missing = next(s for s in wanted if s not in names)
            where = sorted({p.name for p in files.values()})
            raise ModelLoadError(
                f"{next(iter(files.values())).parent}: tensor '{missing}' (parameter '{name}') is missing "
                f"from {', '.join(where)}. The checkpoint does not match its config.json; re-export or "
                "re-download the model."
            )
    used = {s for wanted in plan.values() for s in wanted}
    for name, (stored, path) in names.items():
        if name in used or name in scales or name.endswith(_IGNORED_SUFFIXES) or name.startswith(extra_prefixes):
            continue
        raise ModelLoadError(
            f"{path}: unexpected tensor '{stored}', which no layer of this {type(model).__name__} uses. The "
            "checkpoint does not match its config.json (wrong layer count or layer types?); fix "
            "config.json or re-export the model."
        )
    reader = _Reader(names, fp8, scales)
    read = reader.read
    try:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, tensors in plan.items():
                _fill(params[name], name, tensors, read, names)
            for name in names:
                if name.startswith(extra_prefixes):
                    model.extra_weights[name] = read(name).to(dtype=dtype, device=device)
    finally:
        reader.handles.clear()


def _fill(
    param: torch.Tensor,
    name: str,
    tensors: list[str],
    read: Callable[[str], torch.Tensor],
    names: dict[str, tuple[str, Path]],
) -> None:
    """Copy the checkpoint tensors `tensors` into `param`, one at a time, converted to its dtype by the copy: a
    stacked parameter (a MoE layer's experts) never exists twice, and no converted temporary is made, so the
    load leaves no freed temporaries of a layer's size behind in the heap."""
    flat = param.view(-1)
    offset = 0
    for tensor in tensors:
        value = read(tensor)
        end = offset + value.numel()
        if end > flat.numel() or (len(tensors) == 1 and value.shape != param.shape):
            stored, path = names[tensors[0]]
            raise ModelLoadError(
                f"{path}: tensor '{stored}' has shape {tuple(read(tensors[0]).shape)}, but parameter '{name}' "
                f"needs {tuple(param.shape)}. The checkpoint does not match its config.json; fix config.json or "
                "re-export the model."
            )
        flat[offset:end].copy_(value.reshape(-1))  # to fp32 where `cast` kept the parameter fp32
        offset = end
    if offset != flat.numel():
        stored, path = names[tensors[0]]
        raise ModelLoadError(
            f"{path}: tensor '{stored}' and the {len(tensors) - 1} stacked with it hold {offset} values, but "
            f"parameter '{name}' needs {tuple(param.shape)}. The checkpoint does not match its config.json; fix "
            "config.json or re-export the model."
        )


class _Reader:
    """Checkpoint tensors by model-side name, one open handle per file; an FP8 weight comes back dequantized
    with its block scales."""

    def __init__(self, names: dict[str, tuple[str, Path]], fp8: Fp8Blocks | None, scales: set[str]) -> None:
        self.names, self.fp8, self.scales = names, fp8, scales
        self.handles: dict[Path, safe_open] = {}

    def stored(self, name: str) -> torch.Tensor:
        stored, path = self.names[name]
        try:
            if path not in self.handles:
                self.handles[path] = safe_open(str(path), framework="pt", device="cpu")
            return self.handles[path].get_tensor(stored)
        except Exception as exc:  # safetensors' own error types: truncated file, bad header
            raise ModelLoadError(f"{path}: cannot read tensor '{stored}' ({exc}); download the file again.") from None

    def read(self, name: str) -> torch.Tensor:
        value = self.stored(name)
        if not is_fp8(value):
            return value
        stored, path = self.names[name]
        if self.fp8 is None or name + SCALE_SUFFIX not in self.scales:
            missing = (
                f"its block scales ('{stored}{SCALE_SUFFIX}')" if self.fp8 else "a quantization_config in config.json"
            )
            raise ModelLoadError(
                f"{path}: tensor '{stored}' is {value.dtype} without {missing}; re-download the checkpoint with its "
                "config.json."
            )
        return self.fp8.dequantize(value, self.stored(name + SCALE_SUFFIX), stored)
