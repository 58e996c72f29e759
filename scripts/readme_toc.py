"""The table of contents of README.md, made from its headings (standard library only).

    python3 scripts/readme_toc.py            print the table of contents
    python3 scripts/readme_toc.py --write    put it into README.md, between the toc markers
    python3 scripts/readme_toc.py --check    exit 1 if README.md's table is not the one its headings give

The table lists the ``##`` and ``###`` headings outside code blocks, each linked
by the anchor GitHub gives it, so that a heading added, renamed or moved
without a new table fails ``tests/test_readme.py``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- toc: regenerate with python3 scripts/readme_toc.py --write -->", "<!-- /toc -->"
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*#*\s*$")


def headings(text: str) -> list[tuple[int, str]]:
    """``(level, title)`` of every ``##``/``###`` heading, skipping fenced code (where ``#`` is a comment)."""
    found, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.append((len(match.group(1)), match.group(2)))
    return found


def anchor(title: str, seen: dict[str, int]) -> str:
    """GitHub's anchor: lower case, markup and punctuation dropped, spaces as hyphens, repeats numbered."""
    text = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
    count = seen.get(text, 0)
    seen[text] = count + 1
    return text if count == 0 else f"{text}-{count}"


def table(text: str) -> str:
    seen: dict[str, int] = {}
    lines = []
    for level, title in headings(text):
        lines.append(f"{'  ' * (level - 2)}- [{title}](#{anchor(title, seen)})")
    return "\n".join(lines)


def with_table(text: str) -> str:
    """``text`` with the table between the markers replaced by the one its headings give."""
    try:
        before, rest = text.split(START + "\n", 1)
        _, after = rest.split(END, 1)
    except ValueError:
        raise SystemExit(f"README.md has no table of contents markers: add the lines\n{START}\n{END}") from None
    return f"{before}{START}\n{table(text)}\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite README.md's table of contents")
    mode.add_argument("--check", action="store_true", help="exit 1 if README.md's table is stale")
    parser.add_argument("--readme", type=Path, default=README, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    text = args.readme.read_text(encoding="utf-8")
    if args.write:
        args.readme.write_text(with_table(text), encoding="utf-8")
    elif args.check:
        if with_table(text) != text:
            print(f"{args.readme.name}: the table of contents does not match the headings; "
                  "run: python3 scripts/readme_toc.py --write", file=sys.stderr)
            return 1
    else:
        print(table(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
