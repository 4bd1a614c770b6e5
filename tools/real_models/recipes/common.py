"""What every recipe shares (run by a conversion venv's Python, beside the recipe: no npurt here): its arguments,
the chats the references answer, and reference.json.

A recipe is ``python RECIPE OUT_DIR ARGS_JSON``; it writes the product's folder into OUT_DIR and, once its checks
pass, ``reference.json`` (the builder keeps a folder only with it). A failed check raises: the build fails, naming
it, and nothing is kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MAX_NEW_TOKENS = 64
# single-turn and two-turn chats (the assistant's first turn given), answered greedily by every reference
CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain in two sentences what a CPU does."}],
    [{"role": "user", "content": "List three fruits, one per line."}],
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "2 + 2 = 4."},
     {"role": "user", "content": "And 3 + 5? Answer in one sentence."}],
    [{"role": "user", "content": "Name a vegetable."}, {"role": "assistant", "content": "Carrot."},
     {"role": "user", "content": "What colour is it, and how do people cook it?"}],
]


def arguments() -> tuple[Path, dict[str, Any]]:
    out, args = Path(sys.argv[1]), json.loads(sys.argv[2])
    return out, args


def write_reference(out: Path, reference: dict[str, Any]) -> None:
    (out / "reference.json").write_text(json.dumps(reference, indent=1))


def check(condition: bool, what: str) -> None:
    """A check a product must pass before it is kept."""
    if not condition:
        raise SystemExit(f"check failed: {what}")
