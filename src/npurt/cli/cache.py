"""`npurt cache list | verify | clear`: the entries of npurt's compiled-model cache (option cache_dir)."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from .common import CACHE_DIR_ENV, EXIT_ERROR, CliError, default_cache_dir


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("cache", parents=[common], help="list, verify or clear the compiled-model cache",
                       description="The entries of npurt's compiled-model cache (the runner option cache_dir): what "
                                   "each holds, whether it is sound (verify also checks the CRC-32 of every file "
                                   "it keeps) and whether its model file changed since (stale).")
    p.add_argument("action", choices=("list", "verify", "clear"), help="list entries, verify them, or remove them")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help=f"the cache directory (default: ${CACHE_DIR_ENV}, else $XDG_CACHE_HOME/npurt/compiled, else "
                        "~/.cache/npurt/compiled: where generate, chat and serve --generate keep theirs)")
    p.add_argument("--stale", action="store_true", help="with clear: remove only unsound and stale entries")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def describe(cache: Any, entry: Any, check_blob: bool) -> dict[str, Any]:
    """One entry as the command shows it: what it holds and its state (ok, unsound: why, stale: why)."""
    manifest = entry.manifest or {}
    key = manifest.get("key", {})
    problem = cache.verify(entry) if check_blob and not entry.superseded else entry.problem
    state = "ok"
    if entry.superseded:  # sound, but never found again: stale, not unsound (verify does not fail on it)
        state = f"stale: {problem}"
    elif problem:
        state = f"unsound: {problem}"
    else:
        model = Path(manifest.get("model_path", ""))
        if not model.is_file():
            state = "stale: its model file is gone"
        elif cache.content_hash(model) != key.get("model"):
            state = "stale: its model file changed since"
    return {"entry": entry.path.name, "backend": key.get("backend"), "engine": key.get("engine"),
            "device": key.get("device"), "model": manifest.get("model_path"),
            "bytes": entry.stored_bytes if entry.manifest is not None else None, "files": 1 + len(entry.data),
            "created": manifest.get("created"), "state": state}


LEFTOVER_AGE_S = 3600.0


def run(args: argparse.Namespace) -> int:
    from ..cache import CompiledModelCache

    root = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    if root.exists() and not root.is_dir():
        raise CliError(f"{root} is not a directory")
    cache = CompiledModelCache(root)
    rows = [(entry, describe(cache, entry, check_blob=args.action != "list")) for entry in cache.entries()]
    if args.action == "clear":
        removed = [row for entry, row in rows if not args.stale or row["state"] != "ok"]
        for entry, row in rows:
            if row in removed:
                cache.remove(entry)
        # an interrupted compile's files; with --stale only those an hour old (a compile may be writing one now)
        leftovers = cache.leftovers(LEFTOVER_AGE_S if args.stale else 0.0)
        for path in leftovers:
            cache.remove_leftover(path)
        # the decoders' derived forms and verdicts (option decoder): whole folders, keyed by the export's path, size
        # and time, so an entry is never stale, only unused; --stale keeps them (their weights are links to the
        # exports' files, so removing them frees only what npurt wrote)
        decoders = [] if args.stale else sorted(p for p in (root / "decoders").glob("*") if p.is_dir())
        for folder in decoders:
            shutil.rmtree(folder, ignore_errors=True)
        print(json.dumps({"removed": removed, "leftovers_removed": [str(p) for p in leftovers],
                          "decoders_removed": [str(p) for p in decoders]}, indent=2)
              if args.json else f"removed {len(removed)} of {len(rows)} entries from {root}" +
              (f" and {len(leftovers)} files an interrupted compile left" if leftovers else "") +
              (f", and {len(decoders)} decoders' derived forms" if decoders else ""))
        return 0
    if args.json:
        print(json.dumps({"cache_dir": str(root), "entries": [row for _, row in rows]}, indent=2))
    else:
        print(format_rows(root, [row for _, row in rows]))
    bad = [row for _, row in rows if row["state"].startswith("unsound")]
    return EXIT_ERROR if args.action == "verify" and bad else 0


def format_rows(root: Path, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"{root}: no entries"
    out = [f"{root}: {len(rows)} entries"]
    for r in rows:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])) if r["created"] else "?"
        size = f"{(r['bytes'] or 0) / 2**20:.1f} MiB"
        out.append(f"  {r['entry'][:12]}  {r['backend'] or '?':<9} {str(r['engine'] or '?').split('-')[0]:<11} "
                   f"{r['device'] or '?':<4} {size:>9}  {created}  {r['model'] or '?'}")
        out.append(f"  {'':12}  {r['state']}")
    return "\n".join(out)
