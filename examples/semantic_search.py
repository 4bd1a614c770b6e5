"""Semantic search over a folder of text files: index every paragraph with an embedding model, answer a query with
the paragraphs nearest to it by cosine similarity, on any backend.

What it shows: ``npurt.Embedder(model_dir, backend)`` reading a sentence-transformers folder (or optimum's
export) and ``encode`` giving what sentence-transformers' ``encode`` gives, batched by length; the folder's named
prompts (``query`` / ``document``, where it has them) put before queries and paragraphs; ``normalize=True`` so
that a dot product is the cosine; and the index saved as a .npy file beside its paragraphs, reused while the
files are unchanged.

    python examples/semantic_search.py MODEL_DIR DOCS_DIR "how do I share a buffer?"
    python examples/semantic_search.py MODEL_DIR DOCS_DIR "query" --backend openvino --top 5
    python examples/semantic_search.py MODEL_DIR DOCS_DIR "query" --index /tmp/docs-index   # keep the index

The paragraphs are the files' blocks of text between blank lines (``*.txt`` and ``*.md``, in all sub-folders).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from npurt import Embedder

SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Passage:
    file: str  # relative to the documents' folder
    line: int  # where the paragraph starts, 1-based
    text: str


def passages(folder: Path) -> list[Passage]:
    """Every paragraph (lines between blank lines) of the text files under ``folder``, in file order."""
    out = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        start, block = 0, []
        for number, line in enumerate([*lines, ""], start=1):
            if line.strip():
                if not block:
                    start = number
                block.append(line.strip())
            elif block:
                out.append(Passage(str(path.relative_to(folder)), start, " ".join(block)))
                block = []
    return out


class Index:
    """Unit vectors of passages (float32 [n, dim]): a query's scores are one matrix product."""

    def __init__(self, embedder: Embedder, items: list[Passage]) -> None:
        self.embedder = embedder
        self.passages = items
        prompt = "document" if "document" in embedder.prompts else "passage" if "passage" in embedder.prompts else None
        self.vectors = embedder.encode([p.text for p in items], prompt_name=prompt, normalize=True) if items else \
            np.zeros((0, embedder.dimension), np.float32)

    @classmethod
    def cached(cls, embedder: Embedder, items: list[Passage], where: Path | None) -> tuple[Index, bool]:
        """The index, loaded from ``where`` where it holds these passages embedded by this model, else made (and
        saved there)."""
        key = hashlib.sha256(json.dumps([embedder.name, embedder.max_length, [p.text for p in items]]).encode())
        stamp = key.hexdigest()
        if where is not None and (where / "stamp").is_file() and (where / "stamp").read_text() == stamp:
            index = cls.__new__(cls)
            index.embedder, index.passages, index.vectors = embedder, items, np.load(where / "vectors.npy")
            return index, True
        index = cls(embedder, items)
        if where is not None:
            where.mkdir(parents=True, exist_ok=True)
            np.save(where / "vectors.npy", index.vectors)
            (where / "stamp").write_text(stamp)
        return index, False

    def search(self, query: str, top: int = 3) -> list[tuple[float, Passage]]:
        """The ``top`` passages by cosine similarity to ``query``, best first."""
        prompt = "query" if "query" in self.embedder.prompts else None
        vector = self.embedder.encode(query, prompt_name=prompt, normalize=True)
        scores = self.vectors @ vector
        best = np.argsort(-scores, kind="stable")[:top]
        return [(float(scores[i]), self.passages[i]) for i in best]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the embedding model's folder (sentence-transformers' or optimum's)")
    parser.add_argument("docs", help="the folder of text files to search")
    parser.add_argument("query", nargs="+", help="what to look for (several: each answered)")
    parser.add_argument("--backend", default="AUTO", help="VAIML, OPENVINO, QNN, ONNXRUNTIME or AUTO (default)")
    parser.add_argument("--device", default="AUTO", help="NPU, GPU, CPU or AUTO (default)")
    parser.add_argument("--top", type=int, default=3, help="passages to show per query (default 3)")
    parser.add_argument("--index", type=Path, help="a folder to keep the index in (reused while the files hold)")
    parser.add_argument("--json", action="store_true", help="print the answers as JSON")
    args = parser.parse_args(argv)
    docs = Path(args.docs)
    if not docs.is_dir():
        print(f"semantic_search: {docs} is not a folder", file=sys.stderr)
        return 2
    items = passages(docs)
    if not items:
        print(f"semantic_search: no paragraphs in {docs} ({', '.join(SUFFIXES)} files)", file=sys.stderr)
        return 2
    with Embedder(args.model, args.backend, args.device) as embedder:
        t0 = time.perf_counter()
        index, reused = Index.cached(embedder, items, args.index)
        took = time.perf_counter() - t0
        answers = {query: index.search(query, args.top) for query in args.query}
        if args.json:
            print(json.dumps({"backend": embedder.backend, "passages": len(items), "index": "loaded" if reused
                              else "made", "answers": {
                q: [{"score": round(s, 6), "file": p.file, "line": p.line, "text": p.text} for s, p in found]
                for q, found in answers.items()}}, indent=2))
            return 0
        print(f"{len(items)} paragraphs of {docs} {'loaded from' if reused else 'indexed'}"
              f"{f' {args.index}' if reused else ''} in {took:.2f} s on {embedder.backend} "
              f"{embedder.runner.device_info.attached} ({embedder.name}, {embedder.dimension} dims)")
        for query, found in answers.items():
            print(f"\n{query!r}")
            for score, passage in found:
                print(f"  {score:.3f}  {passage.file}:{passage.line}  {passage.text[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
