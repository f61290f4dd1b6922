"""Host judgments over synthetic hosts (data, not mocks), plus the real probes on this machine."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from sglang_source import SKIP_REASON, SRT

from hybridctl.config.schema import HybridConfig
from hybridctl.doctor.judge import judge_host, resolve_engine, torch_cuda_verdict
from hybridctl.host.cuda_driver import CudaDriverUnavailable, query_cuda_driver
from hybridctl.host.facts import GpuFacts, GpuProcess, HostFacts, SglangFacts, TorchBuild
from hybridctl.host.packages import parse_torch_version_file, read_sglang_source, torch_build
from hybridctl.host.probe import probe_host

GIB = 1 << 30
SGLANG_WHEEL = SRT.parent  # the installed sglang package, found as sglang_source.py finds it


def gpu(index: int = 0, vmm: bool | None = True, procs: tuple[GpuProcess, ...] = (), cc=(9, 0)) -> GpuFacts:
    return GpuFacts(index, "NVIDIA H100 80GB HBM3", cc, 80 * GIB, 79 * GIB, vmm, procs)


def sglang(version: str = "0.5.23", *, hybrid: bool = True, unified: bool = True, old_flag: bool = False):
    return SglangFacts(version, not old_flag, old_flag, hybrid, unified)


def host(driver: str | None = "550.54.15", cuda=(12, 4), gpus=(gpu(),), torch_cuda: str | None = "12.4",
         sgl: SglangFacts | None = None) -> HostFacts:  # fmt: skip
    torch = TorchBuild("2.13.0", torch_cuda)
    return HostFacts(driver, cuda if driver else None, tuple(gpus), torch, sgl or sglang(), c_compiler="/usr/bin/cc")


def elastic_cfg(**extra_args: str) -> HybridConfig:
    cfg = HybridConfig()
    cfg.config.memory.enable_elastic_memory_pool = True
    cfg.config.server.engine = "sglang"
    cfg.config.extra_engine_args.update(extra_args)
    return cfg


def statuses(facts: HostFacts) -> dict[str, str]:
    checks, _ = judge_host(facts)
    return {c.name: c.status for c in checks}


def elastic_codes(facts: HostFacts) -> list[tuple[str, str]]:
    _, findings = judge_host(facts, elastic_cfg())
    return [(f.code, f.severity) for f in findings]


def test_no_driver_no_gpu_is_skipped_not_an_error() -> None:
    facts = HostFacts(torch=TorchBuild("2.13.0+cpu", None), skipped={"nvml": "NVML Shared Library Not Found"})
    s = statuses(facts)
    assert s["NVIDIA driver"] == "skipped" and s["torch"] == "ok" and s["sglang"] == "skipped"
    checks, _ = judge_host(facts)
    assert "NVML Shared Library Not Found" in checks[0].summary


def test_healthy_gpu_host_is_all_ok() -> None:
    assert set(statuses(host()).values()) == {"ok"}
    assert elastic_codes(host()) == []


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (host(driver="525.147.05", cuda=(12, 0)), [("ELASTIC_TIMEOUT", "error")]),
        (host(gpus=(gpu(vmm=False),)), [("ELASTIC_TIMEOUT", "error")]),
        (host(gpus=(gpu(), gpu(1, vmm=False))), [("ELASTIC_TIMEOUT", "error")]),
        (host(gpus=(gpu(procs=(GpuProcess(4242, "python3", 30_000),)),)), [("ELASTIC_TIMEOUT", "warning")]),
        (host(sgl=sglang("0.5.2", unified=False)), [("ELASTIC_TIMEOUT", "error")]),
        (host(gpus=(gpu(vmm=None),)), []),  # libcuda unusable: unknown is not a finding
    ],
)
def test_elastic_pool_judgments(facts: HostFacts, expected: list[tuple[str, str]]) -> None:
    assert elastic_codes(facts) == expected


def test_elastic_findings_only_when_elastic_is_on_and_sglang_serves() -> None:
    old = host(driver="470.82.01", cuda=(11, 4), torch_cuda="11.8")
    assert judge_host(old, HybridConfig())[1] == []
    builtin = elastic_cfg()
    builtin.config.server.engine = "builtin"
    assert judge_host(old, builtin)[1] == []
    _, findings = judge_host(old, elastic_cfg())
    assert findings and findings[0].changes[0].key == "memory.enable_elastic_memory_pool"
    assert findings[0].changes[0].value is False


def test_busy_gpu_lists_processes() -> None:
    facts = host(gpus=(gpu(procs=(GpuProcess(4242, "python3", 30_000), GpuProcess(7, "Xorg", None))),))
    checks, _ = judge_host(facts)
    g = next(c for c in checks if c.name == "GPU 0")
    assert g.status == "warning"
    assert "pid 4242 python3: 30000 MiB" in g.details and "pid 7 Xorg: memory not reported" in g.details


def test_old_compute_capability_warns() -> None:
    assert statuses(host(gpus=(gpu(cc=(7, 0)),)))["GPU 0"] == "warning"


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "driver_major", "expected"),
    [
        ("12.4", (12, 4), 550, None),
        ("12.1", (12, 4), 550, None),
        ("12.8", (12, 2), 535, "warning"),  # minor-version compatibility
        ("12.8", (12, 0), 520, "error"),  # below the 12.x floor (525)
        ("13.0", (12, 8), 570, "error"),
        ("11.8", (12, 2), 535, None),
        ("bogus", (12, 2), 535, "warning"),
    ],
)
def test_torch_vs_driver(torch_cuda: str, driver_cuda, driver_major: int, expected: str | None) -> None:
    verdict = torch_cuda_verdict(torch_cuda, driver_cuda, driver_major)
    assert (verdict[0] if verdict else None) == expected


def test_cpu_torch_on_gpu_host_warns() -> None:
    assert statuses(host(torch_cuda=None))["torch"] == "warning"
    assert statuses(host(driver="535.104.05", cuda=(12, 2), torch_cuda="12.8"))["torch"] == "warning"


def test_sglang_without_hybrid_prefix_cache_warns() -> None:
    assert statuses(host(sgl=sglang("0.4.9", hybrid=False, unified=False)))["sglang"] == "warning"


def test_renamed_strategy_flag_is_left_to_the_config_rules() -> None:
    cfg = HybridConfig()
    cfg.config.extra_engine_args["mamba-scheduler-strategy"] = "extra_buffer"
    assert judge_host(host(), cfg)[1] == []  # engine_flag_rules.py reports it once, as UNKNOWN_ENGINE_FLAG


def test_resolve_engine() -> None:
    assert resolve_engine(host(), None) == "sglang"
    assert resolve_engine(HostFacts(), None) == "builtin"
    cfg = HybridConfig()
    cfg.config.server.engine = "builtin"
    assert resolve_engine(host(), cfg) == "builtin"


def test_torch_version_file_parsed_without_import() -> None:
    text = "from typing import Optional\n__version__ = '2.9.1+cu128'\n"
    text += "cuda: Optional[str] = '12.8'\nhip = None\n"
    assert parse_torch_version_file(text) == {"__version__": "2.9.1+cu128", "cuda": "12.8", "hip": None}
    build = torch_build()  # the real installed torch, read as text
    assert build.version.startswith("2.")


@pytest.mark.skipif(not SGLANG_WHEEL.is_dir(), reason=SKIP_REASON)
def test_sglang_gates_read_from_its_source() -> None:
    facts = read_sglang_source(SGLANG_WHEEL, "0.5.23")
    assert facts == SglangFacts("0.5.23", True, False, True, True)


def test_sglang_gates_of_an_old_layout(tmp_path: Path) -> None:
    srt = tmp_path / "sglang" / "srt"
    (srt / "mem_cache").mkdir(parents=True)
    (srt / "server_args.py").write_text(
        'parser.add_argument("--mamba-scheduler-strategy", type=str)\n', encoding="utf-8"
    )
    (srt / "mem_cache" / "mamba_radix_cache.py").write_text("class MambaRadixCache: ...\n", encoding="utf-8")
    expected = SglangFacts("0.5.6", False, True, True, False)
    assert read_sglang_source(tmp_path / "sglang", "0.5.6") == expected


def test_missing_libcuda_is_a_clear_exception() -> None:
    with pytest.raises(CudaDriverUnavailable, match="not loadable"):
        query_cuda_driver("libcuda-that-does-not-exist.so.1")


def test_real_probe_never_raises() -> None:
    facts = probe_host()
    assert facts.driver_version is not None or "nvml" in facts.skipped
    assert facts.gpus or "nvml" in facts.skipped or facts.driver_version is not None
    checks, _ = judge_host(facts)
    assert checks[0].name == "NVIDIA driver"


def compiler_check(facts: HostFacts) -> tuple[str, str]:
    checks, _ = judge_host(facts)
    found = [c for c in checks if c.name == "C compiler"]
    assert len(found) == 1
    return found[0].status, found[0].summary


def test_c_compiler_found_is_ok() -> None:
    cpu = HostFacts(torch=TorchBuild("2.13.0+cpu", None), c_compiler="/usr/bin/cc")
    assert compiler_check(cpu) == ("ok", "/usr/bin/cc")


def test_no_c_compiler_warns_where_the_bundled_runtime_would_serve() -> None:
    cpu = HostFacts(torch=TorchBuild("2.13.0+cpu", None), skipped={"c_compiler": "no C compiler ($CC, or cc on PATH)"})
    status, summary = compiler_check(cpu)
    assert status == "warning"
    assert "no C compiler" in summary and "torch eager" in summary and "install gcc or clang" in summary


def test_no_c_compiler_on_an_sglang_gpu_host_is_only_noted() -> None:
    gpu_host = dataclasses.replace(
        host(), c_compiler=None, skipped={"c_compiler": "no C compiler ($CC, or cc on PATH)"}
    )
    status, summary = compiler_check(gpu_host)
    assert status == "skipped" and "only the bundled runtime" in summary


def test_the_probe_finds_the_compiler_the_runtime_builds_with(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from hybridshared.compiler import find_c_compiler

    facts = probe_host()
    assert facts.c_compiler == find_c_compiler()
    assert ("c_compiler" in facts.skipped) == (facts.c_compiler is None)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    missing = probe_host()
    assert missing.c_compiler is None and "no C compiler" in missing.skipped["c_compiler"]
