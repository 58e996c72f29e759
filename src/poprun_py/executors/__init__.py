"""Executors: where instances run (this host, over SSH, under srun)."""
