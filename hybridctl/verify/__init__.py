"""Checks against a running server (SGLang 0.5.23 API): basic, prefix-cache, spec.

Public API: `run_checks(target, config, names, options) -> VerifyReport`, `resolve_target`, `load_config`,
`Target`, `VerifyOptions`, `PrefixCacheOptions`, `SpecOptions`, `ServerUnreachable`. No torch, ever.
"""
