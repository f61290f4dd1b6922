"""The one schema for `config.toml` and `settings.json`.

Every key is declared once here: its type, range, default and a one-line doc (`description`). Templates' comments,
the JSON Schema (`hybridctl schema`), the docs table and the SGLang flag mapping are generated from these models.
`json_schema` (at the end) writes the JSON Schemas of both files for editors (VS Code, Taplo).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

from hybridshared.units import MAX_MEMORY_GIB

# An engine flag's value. Finite floats only: TOML writes nan and inf, and no flag takes them.
ScalarValue = str | int | FiniteFloat | bool
EngineName = Literal["auto", "sglang", "builtin"]  # server.engine; also what `--engine` accepts


class _Section(BaseModel):
    # Unknown keys are errors (with a did-you-mean from the validator), never silently ignored.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# ---------------------------------------------------------------------------------------------------------------
# config.toml
# ---------------------------------------------------------------------------------------------------------------


class ServerConfig(_Section):
    host: str = Field("127.0.0.1", description="Address the server binds; 0.0.0.0 exposes it to the network.")
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the key this server requires (never the key itself); "
        "verify and bench send it.",
    )
    port: int = Field(30000, ge=1, le=65535, description="HTTP port of the server (SGLang's default is 30000).")
    model_path: str = Field(
        "", description="Model directory (config.json + safetensors) or hub id; required to launch."
    )
    tokenizer_path: str | None = Field(None, description="Tokenizer directory; unset: the same as model_path.")
    trust_remote_code: bool = Field(False, description="Allow custom model code from the model directory.")
    engine: EngineName = Field(
        "auto", description="Serving engine: sglang on GPU hosts with sglang installed, else the bundled runtime."
    )
    sglang_version: str | None = Field(
        None,
        pattern=r"^v?\d+\.\d+\.\d+(\.?post\d+)?$",
        description='SGLang release the commands target (e.g. "0.5.6"); --sglang-version and an installed '
        "sglang win over it; unset: the installed one, else the newest hybridctl knows.",
    )
    tp_size: int = Field(1, ge=1, le=64, description="Tensor-parallel degree (GPUs per model replica).")
    dp_size: int = Field(1, ge=1, le=64, description="Data-parallel replicas behind one server (SGLang's --dp-size).")
    ep_size: int = Field(
        1, ge=1, le=64, description="Expert-parallel degree for MoE layers (SGLang's --ep-size); 1 = off."
    )
    nnodes: int = Field(1, ge=1, le=64, description="Nodes one server spans (multi-node tensor/expert parallel).")
    node_rank: int = Field(0, ge=0, le=63, description="This node's rank among nnodes (0 = the first node).")
    dist_init_addr: str | None = Field(
        None, description="host:port of node 0 for multi-node start-up; required when nnodes > 1."
    )


class MemoryConfig(_Section):
    mem_fraction_static: float = Field(
        0.85, gt=0.0, lt=1.0, description="Fraction of device memory for weights plus both cache pools."
    )
    mamba_full_memory_ratio: float = Field(
        0.9,
        gt=0.0,
        le=10.0,
        description="Bytes for recurrent-state slots per byte of full-attention KV (SGLang's default 0.9).",
    )
    max_mamba_cache_size: int | None = Field(
        None, ge=1, description="Fix the number of recurrent-state slots; unset: derived from the ratio."
    )
    enable_elastic_memory_pool: bool = Field(
        False, description="Let pages move between the KV and state pools at run time (needs CUDA VMM)."
    )
    elastic_realloc_timeout_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Deadline for one elastic-pool reallocation before it is abandoned."
    )
    memory_budget_gib: float | None = Field(
        None,
        gt=0.0,
        le=MAX_MEMORY_GIB,
        description="Bundled runtime on CPU: memory treated as the device's (unset: 4 GiB).",
    )
    gpu_mem_gib: float | None = Field(
        None,
        gt=0.0,
        le=MAX_MEMORY_GIB,
        description="Memory of one GPU of the server, in GiB (init --gpu-mem-gib): plan and doctor size the pools "
        "for it where NVML sees no GPU; a detected GPU and --gpu-mem-gib win. Not passed to the engine.",
    )


class CacheConfig(_Section):
    enable_prefix_caching: bool = Field(
        True, description="Reuse KV and recurrent state across requests that share a prefix (radix cache)."
    )
    radix_cache_page_size: int = Field(
        1, ge=1, le=256, description="Tokens per KV page; > 1 on hybrids needs mamba_radix_cache_strategy extra_buffer."
    )
    enable_dual_lru_eviction: bool = Field(
        True, description="Evict cached states and KV leaves on two independent LRU lists."
    )
    mamba_radix_cache_strategy: Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"] = Field(
        "auto", description="How states are checkpointed for prefix reuse (SGLang's --mamba-radix-cache-strategy)."
    )
    mamba_track_interval: int = Field(
        256, ge=1, le=65536, description="Tokens between recurrent-state checkpoints (extra_buffer)."
    )


class SpeculativeConfig(_Section):
    speculative_algorithm: Literal["none", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"] = Field(
        "none", description="Speculative decoding algorithm; none turns it off."
    )
    speculative_num_steps: int = Field(3, ge=1, le=16, description="Draft steps per verify round.")
    speculative_num_draft_tokens: int = Field(
        4, ge=2, le=64, description="Tokens verified per round (steps + 1 when topk is 1)."
    )
    speculative_topk: int = Field(1, ge=1, le=16, description="Branching factor of the draft tree (1 = a chain).")
    speculative_draft_model_path: str | None = Field(
        None, description="Draft model directory for STANDALONE (and EAGLE heads shipped separately)."
    )
    enable_mamba_state_sandbox: bool = Field(
        True, description="Give each draft token its own state slot so rejected drafts can be rolled back."
    )


class PDConfig(_Section):
    enable_pd_disaggregation: bool = Field(
        False, description="Run prefill and decode on separate servers that hand over KV and state."
    )
    mamba_state_transfer_mode: Literal["atomic", "layerwise"] = Field(
        "atomic", description="atomic: all layers' state travels in one transfer with the KV (required for hybrids)."
    )
    prefill_port: int = Field(30100, ge=1, le=65535, description="Port of the prefill server under PD.")
    decode_port: int = Field(30200, ge=1, le=65535, description="Port of the decode server under PD.")
    bootstrap_port: int = Field(8998, ge=1, le=65535, description="KV/state transfer bootstrap port.")


class ConfigToml(_Section):
    server: ServerConfig = Field(default_factory=ServerConfig, description="Where and what to serve.")
    memory: MemoryConfig = Field(default_factory=MemoryConfig, description="The two memory pools.")
    cache: CacheConfig = Field(default_factory=CacheConfig, description="Prefix (radix) cache.")
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig, description="Speculative decoding.")
    pd: PDConfig = Field(default_factory=PDConfig, description="Prefill/decode disaggregation.")
    extra_engine_args: dict[str, ScalarValue] = Field(
        default_factory=dict,
        description="Extra engine flags passed through as --name value (checked against the engine's flags).",
    )


# ---------------------------------------------------------------------------------------------------------------
# settings.json
# ---------------------------------------------------------------------------------------------------------------


class RuntimeSettings(_Section):
    chunked_prefill_size: int = Field(
        8192, ge=-1, description="Max prompt tokens per prefill step; -1 disables chunking."
    )
    max_running_requests: int | None = Field(
        None, ge=1, description="Cap on concurrently running requests; unset: derived from the state pool."
    )
    schedule_policy: Literal["fcfs", "lpm", "random", "dfs-weight", "lof", "priority"] = Field(
        "fcfs", description="Queue order: fcfs (arrival) or lpm (longest cached prefix first), ..."
    )
    disable_radix_cache: bool = Field(False, description="Turn the prefix cache off (overrides [cache]).")
    enable_torch_compile: bool = Field(
        False,
        description="Compile the decode forward with torch.compile (start-up pays the compile; decode gets faster; "
        "the bundled runtime also compiles short extends).",
    )
    torch_compile_max_bs: int = Field(
        32, ge=1, le=1024, description="Largest decode batch that runs the compiled forward; bigger ones run eager."
    )
    torch_compile_max_extend_tokens: int = Field(
        128,
        ge=0,
        le=1024,
        description="Bundled runtime with enable_torch_compile: longest one-request extend (a short prompt, the "
        "uncached tail after a prefix hit) that runs a compiled forward; 0 keeps extends eager.",
    )


class MambaSettings(_Section):
    state_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the recurrent (SSM) state; float32 is exact, 16-bit halves the pool."
    )
    state_snapshot_on_match: bool = Field(
        True, description="On a prefix hit copy the cached state into the request's own slot."
    )
    state_copy_on_write: bool = Field(
        True, description="Never write a cached state in place; write a new slot instead."
    )


class LoggingSettings(_Section):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Server log level.")
    log_requests: bool = Field(False, description="Log every request's metadata.")
    log_mamba_state_stats: bool = Field(False, description="Log state-pool usage, hit rate and evictions periodically.")


class ApiSettings(_Section):
    base_url: str | None = Field(
        None, description="Upstream OpenAI-compatible gateway used to compare answers (optional)."
    )
    api_key_env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the upstream gateway's key (never the key itself).",
    )
    timeout_seconds: float = Field(120.0, gt=0.0, le=3600.0, description="Per-request timeout for the gateway.")


class SettingsJson(_Section):
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings, description="Scheduling.")
    mamba: MambaSettings = Field(default_factory=MambaSettings, description="Recurrent state handling.")
    logging: LoggingSettings = Field(default_factory=LoggingSettings, description="Logging.")
    api: ApiSettings = Field(default_factory=ApiSettings, description="Upstream gateway for comparisons.")


class HybridConfig(BaseModel):
    """Both files, loaded together: what every consumer (planner, launch, doctor, verify) takes."""

    model_config = ConfigDict(extra="forbid")

    config: ConfigToml = Field(default_factory=ConfigToml)
    settings: SettingsJson = Field(default_factory=SettingsJson)

    @property
    def prefix_cache_enabled(self) -> bool:
        return self.config.cache.enable_prefix_caching and not self.settings.runtime.disable_radix_cache

    @property
    def speculative_enabled(self) -> bool:
        return self.config.speculative.speculative_algorithm != "none"


SchemaFile = Literal["config", "settings"]
SCHEMA_FILE_NAMES: dict[SchemaFile, str] = {
    "config": "config.schema.json",
    "settings": "settings.schema.json",
}
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def json_schema(which: SchemaFile) -> dict[str, Any]:
    """The JSON Schema of config.toml ("config") or settings.json ("settings"), with every key's doc."""
    if which == "config":
        schema = ConfigToml.model_json_schema()
        schema["title"] = "hybridctl config.toml"
        schema["description"] = (
            "What to serve and how the engine lays out memory for a hybrid model. Reference: "
            "docs/configuration.md; check with `hybridctl validate`."
        )
    elif which == "settings":
        schema = SettingsJson.model_json_schema()
        schema["title"] = "hybridctl settings.json"
        schema["description"] = (
            "Scheduling, recurrent-state handling, logging and the optional upstream gateway. Reference: "
            "docs/configuration.md; check with `hybridctl validate`."
        )
        # settings.json names its schema for editors; the loader drops the key before validating.
        schema["properties"] = {
            "$schema": {"type": "string", "description": "Path or URL of this JSON Schema (for editors)."},
            **schema["properties"],
        }
    else:
        raise ValueError(f"unknown schema {which!r}; expected 'config' or 'settings'")
    return {"$schema": DRAFT, **schema}
