"""Output torture: write awkward output on purpose.

usage: emit.py MODE [N]
  lines N      N lines "<instance> <seq>" as fast as possible
  progress     a \\r progress bar then a newline
  nonewline    a last line without a newline
  invalid      invalid UTF-8 bytes on a line
  split        a multibyte character written in two flushes
  bigline N    one line of N bytes, no newline, in 64 KiB writes
  stderr       one line on stdout, one on stderr
"""

import os
import sys

import popdist

out = sys.stdout.buffer


def main() -> None:
    mode = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    index = popdist.getInstanceIndex()
    if mode == "lines":
        out.write(b"".join(b"%d %d\n" % (index, i) for i in range(n)))
    elif mode == "progress":
        for pct in (0, 50, 100):
            out.write(b"\r%d%%" % pct)
            out.flush()
        out.write(b"\n")
    elif mode == "nonewline":
        out.write(b"first\nlast without newline")
    elif mode == "invalid":
        out.write(b"bad \xff\xfe bytes\n")
    elif mode == "split":
        euro = "€".encode()
        out.write(b"price " + euro[:1])
        out.flush()
        os.write(1, b"")  # a separate write for the rest
        out.write(euro[1:] + b" 3\n")
    elif mode == "bigline":
        chunk = b"x" * 65536
        for _ in range(n // len(chunk)):
            out.write(chunk)
            out.flush()
        out.write(b"x" * (n % len(chunk)))
    elif mode == "stderr":
        out.write(b"to stdout\n")
        out.flush()
        sys.stderr.buffer.write(b"to stderr\n")
    out.flush()


if __name__ == "__main__":
    main()
