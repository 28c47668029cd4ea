"""Write docs/troubleshooting.md's failure kinds from the failure catalogue (autotune.views.troubleshooting).

    python scripts/troubleshooting.py           # rewrite docs/troubleshooting.md between the markers
    python scripts/troubleshooting.py --check   # exit 1 when the page differs (what the test checks)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autotune.views.troubleshooting import BEGIN, END, section

PAGE = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"


def rewritten(text: str) -> str:
    """`text` with everything from BEGIN to END replaced by the section as the catalogue writes it."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{PAGE}: no troubleshooting markers; put {BEGIN!r} and {END!r} where it goes")
    return text[:start] + section() + text[end + len(END) :]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the page is up to date")
    args = parser.parse_args()
    text = PAGE.read_text()
    new = rewritten(text)
    if args.check:
        if new != text:
            print(f"{PAGE}: the failure kinds differ: run python scripts/troubleshooting.py")
            return 1
        return 0
    PAGE.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
