"""``python -m poprun_py`` is ``poprun``."""

from .cli import main

raise SystemExit(main())
