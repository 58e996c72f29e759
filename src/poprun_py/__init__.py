"""poprun-py: a pure-Python PopRun launcher (no MPI, no IPUs needed)."""

__version__ = "0.1.0"
