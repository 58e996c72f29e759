"""The dataset that ships inside popdist: present after install, read without any download."""

from __future__ import annotations

import numpy as np

from popdist.datasets import DIGITS_SAMPLES, load_digits


def test_digits_load_from_the_package() -> None:
    images, labels = load_digits()
    assert images.shape == (DIGITS_SAMPLES, 64) and images.dtype == np.float64
    assert labels.shape == (DIGITS_SAMPLES,) and labels.dtype == np.int64
    assert images.min() == 0.0 and images.max() == 1.0  # pixels 0..16, scaled
    counts = np.bincount(labels)
    assert len(counts) == 10 and counts.min() >= 170  # every digit, roughly balanced (174-183 each)
