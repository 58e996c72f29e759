"""The package's version, in a module of its own: what the agent's greeting compares needs nothing else of
the package (``poprun_py/__init__`` reaches the launcher, which reaches the greeting)."""

__version__ = "0.1.0"
