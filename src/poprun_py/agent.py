"""``python -m poprun_py.agent``: the short name of the per-host agent (see ``executors/agent.py``)."""

from .executors.agent import main

if __name__ == "__main__":
    raise SystemExit(main())
