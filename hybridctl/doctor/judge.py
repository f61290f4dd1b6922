"""Judge the host: pure functions from `HostFacts` (and the config) to check lines and findings.

Nothing here touches the system, so every situation (old driver, no VMM, a CPU torch on a GPU host, busy GPUs,
an sglang that predates a flag) is a test case written as data.
"""

from __future__ import annotations

from typing import Literal

from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.findings import Change, Check, DoctorFinding
from hybridctl.host.facts import GpuFacts, HostFacts
from hybridctl.launch.plan import decide_engine
from hybridshared.units import format_gib

# CUDA VMM-backed pools (cuMemCreate/cuMemMap, SGLang's handle types) need the R535 driver branch.
MIN_ELASTIC_DRIVER = 535
# Oldest driver branch that runs any toolkit of a CUDA major release (minor-version compatibility).
MIN_DRIVER_FOR_CUDA_MAJOR = {11: 450, 12: 525, 13: 580}
Engine = Literal["sglang", "builtin"]
# What the bundled runtime does with this torch on a GPU host (runtime/core/device_path.py, docs/runtime-design.md).
BUNDLED_ON_GPU = (
    "the bundled runtime runs on one GPU with this torch: eager torch with the MoE routed on the device and one "
    "readback per step, no CUDA graphs or fused kernels (SGLang is the fast GPU server); benchmarks/gpu_check.py "
    "--device cuda, in the source tree, checks that path on this host"
)


def resolve_engine(facts: HostFacts, cfg: HybridConfig | None) -> Engine:
    """Which engine a launch would use here: auto: sglang on a GPU host with sglang, else builtin."""

    return decide_engine(cfg.config.server.engine if cfg else "auto", facts).engine


def judge_host(facts: HostFacts, cfg: HybridConfig | None = None) -> tuple[list[Check], list[DoctorFinding]]:
    checks = [_driver_check(facts)]
    checks += [_gpu_check(g) for g in facts.gpus]
    checks += [_torch_check(facts), _sglang_check(facts), _compiler_check(facts, cfg)]
    findings: list[DoctorFinding] = []
    # Flags in extra_engine_args (renamed ones included) are the config rules' job (engine_flag_rules.py).
    elastic = cfg is not None and cfg.config.memory.enable_elastic_memory_pool
    if elastic and resolve_engine(facts, cfg) == "sglang":
        findings += elastic_host_findings(facts)
    return checks, findings


def _driver_check(facts: HostFacts) -> Check:
    if facts.driver_version is None:
        reason = facts.skipped.get("nvml", "NVML gave no driver version")
        return Check("NVIDIA driver", "skipped", f"skipped: {reason}")
    cuda = ".".join(map(str, facts.cuda_driver_version)) if facts.cuda_driver_version else "unknown"
    details = [f"supports CUDA up to {cuda}"]
    major = facts.driver_major
    if major is not None and major < MIN_ELASTIC_DRIVER:
        details.append(f"below {MIN_ELASTIC_DRIVER}: the VMM-backed elastic memory pool is unavailable")
    if "cuda_driver" in facts.skipped:
        details.append(f"libcuda: {facts.skipped['cuda_driver']}")
    return Check("NVIDIA driver", "ok", f"{facts.driver_version} (CUDA {cuda})", tuple(details))


def _gpu_check(g: GpuFacts) -> Check:
    cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
    vmm = {True: "yes", False: "no", None: "unknown"}[g.vmm_supported]
    summary = f"{g.name}, sm {cc}, {format_gib(g.free_bytes)} free of {format_gib(g.total_bytes)}"
    details = [f"CUDA virtual memory management: {vmm}"]
    status: Literal["ok", "warning"] = "ok"
    if g.processes:
        status = "warning"
        summary += f", {len(g.processes)} other process(es) on it"
        for p in g.processes:
            used = f"{p.used_mib} MiB" if p.used_mib is not None else "memory not reported"
            details.append(f"pid {p.pid} {p.name}: {used}")
    if g.compute_capability is not None and g.compute_capability < (8, 0):
        status = "warning"
        details.append("compute capability below 8.0: no native bfloat16, hybrid kernels fall back or fail")
    return Check(f"GPU {g.index}", status, summary, tuple(details))


def _torch_check(facts: HostFacts) -> Check:
    t = facts.torch
    if t is None:
        return Check("torch", "skipped", f"skipped: {facts.skipped.get('torch', 'not found')}")
    if t.cuda is None:
        if facts.gpus:
            return Check(
                "torch",
                "warning",
                f"{t.version}: a CPU build on a GPU host",
                (
                    "SGLang and the bundled runtime's GPU path need a CUDA build of torch; with this one the bundled "
                    "runtime runs on the CPU",
                ),
            )
        return Check("torch", "ok", f"{t.version} (CPU build)")
    summary = f"{t.version} built for CUDA {t.cuda}"
    details = (BUNDLED_ON_GPU,) if facts.gpus else ()
    verdict = torch_cuda_verdict(t.cuda, facts.cuda_driver_version, facts.driver_major)
    if verdict is None:
        return Check("torch", "ok", summary, details)
    status, why = verdict
    return Check("torch", status, f"{summary}: {why}", details)


def torch_cuda_verdict(
    torch_cuda: str, driver_cuda: tuple[int, int] | None, driver_major: int | None
) -> tuple[Literal["warning", "error"], str] | None:
    """None when the driver runs torch's CUDA build; else how bad and why."""
    try:
        built = tuple(int(x) for x in torch_cuda.split(".")[:2])
    except ValueError:
        return ("warning", f"cannot read torch's CUDA version {torch_cuda!r}")
    if driver_cuda is None or built <= driver_cuda:
        return None
    have = ".".join(map(str, driver_cuda))
    floor = MIN_DRIVER_FOR_CUDA_MAJOR.get(built[0])
    if built[0] > driver_cuda[0] or floor is None or (driver_major is not None and driver_major < floor):
        return (
            "error",
            f"the driver supports only CUDA {have}; install a torch built for CUDA <= {have} or upgrade the driver",
        )
    return (
        "warning",
        f"newer than the driver's CUDA {have}: runs through minor-version compatibility, "
        "but kernels compiled with PTX for it may fail to load; upgrade the driver",
    )


def _sglang_check(facts: HostFacts) -> Check:
    s = facts.sglang
    if s is None:
        reason = facts.skipped.get("sglang", "not found")
        return Check("sglang", "skipped", f"skipped: {reason}; the bundled runtime serves instead")
    details = (
        f"SGLang's --mamba-radix-cache-strategy: {'yes' if s.has_radix_cache_strategy_flag else 'no'}",
        f"SGLang's --mamba-scheduler-strategy (older name): {'yes' if s.has_scheduler_strategy_flag else 'no'}",
        f"prefix cache for Mamba state: {'yes' if s.has_hybrid_prefix_cache else 'no'}",
        f"SGLang's --enable-unified-memory (elastic pool): {'yes' if s.has_unified_memory_flag else 'no'}",
    )
    if not s.has_hybrid_prefix_cache:
        return Check("sglang", "warning", f"{s.version}: no prefix cache for hybrid models", details)
    return Check("sglang", "ok", s.version, details)


def _compiler_check(facts: HostFacts, cfg: HybridConfig | None) -> Check:
    """The bundled runtime's native kernels need a C compiler at first start (then cached); without one it
    serves through torch eager, several times slower per decoded token. Only a warning where that runtime is
    what a launch would start."""
    if facts.c_compiler is not None:
        return Check(
            "C compiler",
            "ok",
            facts.c_compiler,
            ("the bundled runtime builds its native decode and short-extend kernels with it at first start",),
        )
    why = facts.skipped.get("c_compiler", "not probed")
    if why.startswith("not probed"):
        return Check("C compiler", "skipped", f"skipped: {why}")
    effect = "the bundled runtime falls back to torch eager, several times slower per decoded token"
    fix = "install gcc or clang, or set CC to a compiler"
    if resolve_engine(facts, cfg) == "builtin":
        return Check("C compiler", "warning", f"{why}: {effect}; {fix}")
    return Check("C compiler", "skipped", f"{why}: only the bundled runtime needs one")


_ELASTIC_OFF = (Change("config.toml", "memory.enable_elastic_memory_pool", False),)
_OR_OFF = "or set memory.enable_elastic_memory_pool = false."


def _elastic(severity: Literal["error", "warning"], evidence: str, cause: str, fix: str) -> DoctorFinding:
    return DoctorFinding("ELASTIC_TIMEOUT", severity, cause, fix, _ELASTIC_OFF, "host", None, evidence)


def elastic_host_findings(facts: HostFacts) -> list[DoctorFinding]:
    """Why an elastic (VMM-backed) pool would stall or fail on this host."""
    out = []
    major = facts.driver_major
    if major is not None and major < MIN_ELASTIC_DRIVER:
        cause = (
            f"Driver {facts.driver_version} is older than {MIN_ELASTIC_DRIVER}: the VMM calls the elastic "
            "pool grows with are missing or unreliable, so reallocations stall until they time out."
        )
        fix = f"Upgrade the NVIDIA driver to >= {MIN_ELASTIC_DRIVER}, {_OR_OFF}"
        out.append(_elastic("error", f"driver {facts.driver_version}", cause, fix))
    for g in facts.gpus:
        if g.vmm_supported is False:
            cause = (
                f"GPU {g.index} ({g.name}) reports no CUDA virtual memory management support "
                "(attribute 102), so the elastic pool cannot map pages."
            )
            fix = f"Run on a device with VMM support, {_OR_OFF}"
            out.append(_elastic("error", f"GPU {g.index} {g.name}: VMM unsupported", cause, fix))
        if g.processes:
            held = sum(p.used_mib or 0 for p in g.processes)
            cause = (
                f"{len(g.processes)} other process(es) hold {held} MiB on GPU {g.index}; pages the elastic "
                "pool wants to map can be taken by them, and a reallocation then waits until it times out."
            )
            fix = f"Stop the other processes or give the server a GPU of its own, {_OR_OFF}"
            evidence = f"GPU {g.index}: " + ", ".join(f"pid {p.pid} {p.name}" for p in g.processes)
            out.append(_elastic("warning", evidence, cause, fix))
    s = facts.sglang
    if s is not None and not s.has_unified_memory_flag:
        cause = f"SGLang {s.version} has no --enable-unified-memory, so it has no elastic pool."
        fix = f"Upgrade sglang (0.5.23 has it), {_OR_OFF}"
        out.append(_elastic("error", f"sglang {s.version}", cause, fix))
    return out
