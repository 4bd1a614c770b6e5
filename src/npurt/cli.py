"""The npurt command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("npurt: no backend installed yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
