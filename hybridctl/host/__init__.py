"""What this machine offers: GPUs, drivers, CUDA VMM, torch and sglang builds (probed only)."""
