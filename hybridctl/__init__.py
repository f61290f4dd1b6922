"""hybridctl: configure, plan, launch and verify hybrid-model serving (control plane; never imports torch)."""

__version__ = "0.1.0"
