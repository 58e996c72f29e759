"""``python -m simipu`` is ``simipu``."""

from simipu.cli import main

main()
