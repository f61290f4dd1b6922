"""What the probe found about the host, as plain data.

Probing (probe.py) fills these; judging (hybridctl/doctor/judge.py) only reads them, so judgments are tested
over synthetic hosts written as data. `None` always means "could not be determined" and comes with a reason
in `HostFacts.skipped` — never a guess.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int | None  # None: the driver does not report per-process memory (e.g. some containers)


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    compute_capability: tuple[int, int] | None
    total_bytes: int
    free_bytes: int
    vmm_supported: (
        bool | None
    )  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED; None: libcuda unusable
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class TorchBuild:
    version: str  # e.g. "2.13.0+cu128"
    cuda: str | None  # CUDA toolkit torch was built against, e.g. "12.8"; None: a CPU (or ROCm) build


@dataclass(frozen=True)
class SglangFacts:
    version: str
    # Feature gates read from the installed package's own source text (authoritative for that build).
    has_radix_cache_strategy_flag: bool  # --mamba-radix-cache-strategy
    has_scheduler_strategy_flag: bool  # --mamba-scheduler-strategy (the older name)
    has_hybrid_prefix_cache: bool  # a radix cache that snapshots Mamba state
    has_unified_memory_flag: bool  # --enable-unified-memory (the elastic pool)


@dataclass(frozen=True)
class HostFacts:
    driver_version: str | None = None  # NVIDIA kernel driver, e.g. "535.183.01"
    cuda_driver_version: tuple[int, int] | None = None  # highest CUDA the driver supports, e.g. (12, 2)
    gpus: tuple[GpuFacts, ...] = ()
    torch: TorchBuild | None = None
    sglang: SglangFacts | None = None
    c_compiler: str | None = None  # what the bundled runtime builds its native kernels with
    # Probe step -> why it was skipped (no NVML, no libcuda.so.1, package missing, ...).
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def driver_major(self) -> int | None:
        if not self.driver_version:
            return None
        head = self.driver_version.split(".", 1)[0]
        return int(head) if head.isdigit() else None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
