"""config.toml + settings.json: the schema (schema.py), loading and validation (loader.py, rules.py), and
what `init` / `schema` write. Nothing is imported here so that `import hybridctl.config.x` stays cheap."""
