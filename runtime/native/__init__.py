"""The runtime's C kernels: built with the host's compiler at first use and cached (`build.py`)."""
