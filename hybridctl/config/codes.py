"""Every finding code `validate` can report and what it means: stable names scripts and the doctor match."""

from __future__ import annotations

FINDING_CODES: dict[str, str] = {
    # reading and parsing
    "FILE_NOT_FOUND": "config.toml does not exist (settings.json may be absent: defaults apply).",
    "FILE_UNREADABLE": "The path is a directory or cannot be read.",
    "FILE_ENCODING": "The file is not UTF-8 text.",
    "TOML_SYNTAX": "config.toml is not valid TOML (line and column given).",
    "JSON_SYNTAX": "settings.json is not valid JSON (line and column given).",
    "DUPLICATE_KEY": "A key appears twice: an error in TOML, a warning in JSON (only the last counts).",
    "SETTINGS_DEFAULTS": "settings.json is absent; every setting takes its default (info).",
    # schema
    "UNKNOWN_KEY": "A key the schema does not have; the fix names the closest key or where it belongs.",
    "WRONG_TYPE": 'A value of the wrong type (types are strict: "8080" is not a port).',
    "OUT_OF_RANGE": "A number outside the key's range (quoted from the schema).",
    "INVALID_CHOICE": "A value not among the key's choices.",
    "INVALID_VALUE": "A string not matching the key's pattern (e.g. api_key_env must name a variable).",
    "LITERAL_SECRET": "A literal credential in either file; name an environment variable instead.",
    # cross-file and engine rules (hybridctl/config/rules.py, engine_flag_rules.py)
    "PREFIX_CACHE_MISS": "Settings that make prefix hits impossible, or that the engine refuses.",
    "PAGE_SIZE_MISMATCH": "extra_buffer needs mamba_track_interval to be a multiple of the page size.",
    "SPEC_ROLLBACK": "Speculative decoding that cannot roll the recurrent state back to the accepted token.",
    "SPEC_DRAFT_MODEL": "STANDALONE speculative decoding without a draft model.",
    "PD_STATE_MISMATCH": "PD disaggregation whose state transfer can disagree with the KV it travels with.",
    "PD_STRATEGY_UNSUPPORTED": "A radix-cache strategy SGLang does not support under PD disaggregation.",
    "PORT_CONFLICT": "Two servers (or the bootstrap) on one port under PD.",
    "ELASTIC_SPEC_UNSUPPORTED": "The elastic pool with a speculative algorithm or draft tree it cannot run.",
    "ELASTIC_PD_SPEC": "The elastic pool with PD and speculative decoding over Mooncake (unsupported).",
    "BUILTIN_UNSUPPORTED": "A feature or policy the bundled runtime does not implement.",
    "BUILTIN_REFUSES": "The bundled runtime's own argument parser refuses the command launch would start.",
    "MODEL_PATH_MISSING": "server.model_path is empty: nothing to serve.",
    "MODEL_PATH_NOT_FOUND": "server.model_path names nothing the engine can load (or a hub id on the runtime).",
    "HOST_INVALID": "server.host is empty, too long or not an address: an error.",
    "HOST_EXPOSED": "server.host listens beyond this machine and the server has no key: a warning.",
    "MULTINODE": "nnodes > 1 without dist_init_addr, or node_rank not below nnodes.",
    "UNKNOWN_ENGINE_FLAG": "An [extra_engine_args] flag the engine does not have (or renamed).",
    "ENGINE_FLAG_VALUE": "An [extra_engine_args] value the flag does not accept.",
    # the target SGLang release (hybridctl/config/release_rules.py; --sglang-version, installed, server.sglang_version)
    "SGLANG_RELEASE_VALUE": "A value the target SGLang release's flag does not accept (fix: a value it does).",
    "SGLANG_RELEASE_KEY": "A key only newer SGLang releases have a flag for (fix: its default, or >= that release).",
    "SGLANG_RELEASE_FLAG": "A flag the target SGLang release's parser does not have.",
    "SGLANG_RELEASE_CHANGES": "A setting the target SGLang release silently changes at start-up (warning).",
    "SGLANG_RELEASE_UNCHECKED": "hybridctl holds no flag table for the target release; the nearest older was used.",
    "ENGINE_FLAG_SHADOWS_KEY": "An [extra_engine_args] flag that a config key already sets.",
    "ENGINE_VERSION_UNKNOWN": "No flag table for the requested engine version; the nearest one was used.",
}
