"""``python -m tools.real_models build NAME...`` (a product or a group: smollm2), ``path NAME``, ``list``."""

from __future__ import annotations

import argparse
import sys

from . import GROUPS, PRODUCTS, Missing, build, cache_root, path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.real_models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build products (and what they are made from) where not cached").add_argument(
        "names", nargs="+", metavar="NAME", help=f"products or groups ({', '.join(GROUPS)})")
    sub.add_parser("path", help="print a built product's folder").add_argument("name", metavar="NAME")
    sub.add_parser("list", help="every product, built or not")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            for name, folder in build(args.names).items():
                print(f"{name}\t{folder}")
        except (KeyError, RuntimeError) as e:
            print(f"real_models: {e}", file=sys.stderr)
            return 1
    elif args.command == "path":
        try:
            print(path(args.name))
        except (KeyError, Missing) as e:
            print(f"real_models: {e}", file=sys.stderr)
            return 1
    else:
        print(f"cache: {cache_root()}")
        for name, product in PRODUCTS.items():
            try:
                where = str(path(name))
            except Missing:
                where = "(not built)"
            print(f"{name}\t{where}\n    {product.description}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
