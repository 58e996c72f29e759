"""A program that draws a progress bar with \\r, as tqdm or examples/train.py do, and ends on it."""

import sys

for step in range(1, 4):
    sys.stdout.write(f"\rprogress {step}/3 [{'#' * step}{'.' * (3 - step)}]")
    sys.stdout.flush()
