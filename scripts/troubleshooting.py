"""Write the README's troubleshooting entries from the failure catalogue (autotune.views.troubleshooting).

    python scripts/troubleshooting.py           # rewrite the README between the markers
    python scripts/troubleshooting.py --check   # exit 1 when the README differs (what the test checks)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.views.troubleshooting import BEGIN, END, section

README = Path(__file__).resolve().parent.parent / "README.md"


def rewritten(text: str) -> str:
    """`text` with everything from BEGIN to END replaced by the section as the catalogue writes it."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{README}: no troubleshooting markers; put {BEGIN!r} and {END!r} where it goes")
    return text[:start] + section() + text[end + len(END) :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the README is up to date")
    args = parser.parse_args()
    text = README.read_text()
    new = rewritten(text)
    if args.check:
        if new != text:
            print(f"{README}: the troubleshooting section differs: run python scripts/troubleshooting.py")
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
