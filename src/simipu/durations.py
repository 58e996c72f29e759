"""The one rule for a number of seconds a user gives: simipu's options, and poprun's (which import it from here).

A duration must be finite, more than zero (or at least a stated minimum) and
at most ``MAX_SECONDS`` (about 11.5 days). The waits behind these options are
``poll``/``epoll`` calls and socket timeouts, which take milliseconds in a C
``int`` (at most 2**31 ms, about 24.8 days): a larger value overflows, and
``nan``, ``inf`` or ``1e400`` (which parses as ``inf``) is no bound at all,
so a server would wait for ever on a silent peer.
"""

from __future__ import annotations

import math
from typing import Any

MAX_SECONDS = 1_000_000.0
"""The longest wait any option may ask for (below poll's 2**31 ms, ~24.8 days)."""


def shown(value: object, limit: int = 40) -> str:
    """``value`` as a user typed it, cut short so an error stays one readable line."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_seconds(value: Any, minimum: float = 0.0, allow_zero: bool = False, why: str = "") -> float:
    """``value`` as a number of seconds within the rule above; else ValueError saying the range (``why`` after it)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number of seconds")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{value!r} is not a number of seconds") from None
    low_ok = number >= minimum and (number > 0 or allow_zero)
    if not (math.isfinite(number) and low_ok and number <= MAX_SECONDS):
        span = f"from {minimum:g} to" if minimum or allow_zero else "more than 0 and at most"
        raise ValueError(f"must be {span} {MAX_SECONDS:.0f} seconds{why}, got {shown(value)}")
    return number
