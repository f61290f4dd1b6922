"""The models hybridctl knows by name: bundled config.json files standing in for checkpoints this host lacks."""
