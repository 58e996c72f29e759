"""The guide's module path ``popdist.popdist_core``: the same functions as popdist.core."""

from popdist.core import *  # noqa: F401,F403 - the re-export is the point
from popdist.core import __all__ as __all__
