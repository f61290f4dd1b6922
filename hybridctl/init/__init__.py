"""`hybridctl init`: render a config for a model and host, and check it with validate's rules."""
