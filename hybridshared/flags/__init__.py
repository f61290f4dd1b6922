"""The engines' flag tables: SGLang's launch_server flags per release, and the bundled runtime's own options."""
