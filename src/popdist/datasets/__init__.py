"""Small real datasets that ship inside the package, so examples and tests never download.

``load_digits()``: the UCI optical recognition of handwritten digits test set
(E. Alpaydin and C. Kaynak, 1998; CC BY 4.0), 1797 8x8 images of the digits
0-9 with integer pixels 0..16, as scikit-learn ships it
(``sklearn/datasets/data/digits.csv.gz``: 64 pixel columns, then the label).
"""

from __future__ import annotations

import gzip
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported when a dataset is loaded, not with popdist
    import numpy as np

__all__ = ["DIGITS_SAMPLES", "load_digits"]

DIGITS_SAMPLES = 1797
_DIGITS_FILE = "digits.csv.gz"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """``(images, labels)``: float64 pixels scaled to [0, 1], shape (1797, 64), and int64 labels 0-9."""
    import numpy as np

    with resources.files(__name__).joinpath(_DIGITS_FILE).open("rb") as packed, gzip.open(packed, "rt") as text:
        table = np.loadtxt(text, delimiter=",", dtype=np.int64)
    if table.shape != (DIGITS_SAMPLES, 65):
        raise RuntimeError(f"{_DIGITS_FILE} has shape {table.shape}, not ({DIGITS_SAMPLES}, 65): "
                           "the installed package is damaged; reinstall poprun-py")
    return table[:, :64].astype(np.float64) / 16.0, table[:, 64].copy()
