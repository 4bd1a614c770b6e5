"""examples/semantic_search.py on the real all-MiniLM-L6-v2 (tools/real_models): a folder of text files indexed
paragraph by paragraph, each query answered by the paragraph it is about, on OpenVINO, with the scores of
the cosines of sentence-transformers-exact embeddings computed here through npurt.Embedder on VAIML; the index kept
and reused while the files hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npurt import Embedder
from tests.helpers.real_models import folder

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "semantic_search.py"
FILES = {
    "kitchen/bread.txt": "Sourdough bread needs a starter of flour and water.\nFeed it daily and bake the loaf in a "
                         "hot oven.\n\nFresh pasta is flour and eggs, rolled thin and cut into ribbons.",
    "space.txt": "Jupiter is the largest planet in the solar system, a gas giant with a great red storm.\n\n"
                 "Rockets reach orbit by burning fuel in stages that fall away.",
    "computers.md": "Two processes can share a buffer through a DMA-BUF file descriptor passed over a Unix socket.\n\n"
                    "A neural processing unit runs small encoders efficiently.",
    "notes.bin": "not a text file: ignored",
}
QUERIES = {"How do I bake bread at home?": "kitchen/bread.txt", "Which planet is the biggest?": "space.txt",
           "share memory between programs": "computers.md"}


def search(model: Path, docs: Path, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(EXAMPLE), str(model), str(docs), *QUERIES, "--json", *extra],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def test_each_query_finds_its_paragraph(tmp_path):
    backend = "OPENVINO"  # (the scores checked here come through VAIML)
    model = folder("minilm-st")
    docs = tmp_path / "docs"
    for name, text in FILES.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    result = search(model, docs, "--backend", backend, "--top", "2", "--index", str(tmp_path / "index"))
    assert result["backend"] == backend and result["passages"] == 6 and result["index"] == "made"
    paragraphs = [p for f in sorted(FILES) if f.endswith((".txt", ".md")) for p in FILES[f].split("\n\n")]
    with Embedder(model, "VAIML", "CPU") as embedder:
        vectors = embedder.encode([p.replace("\n", " ") for p in paragraphs], normalize=True)
        for query, file in QUERIES.items():
            found = result["answers"][query]
            assert found[0]["file"] == file, (query, found)
            want = vectors @ embedder.encode(query, normalize=True)
            for answer in found:
                k = paragraphs.index(next(p for p in paragraphs if p.replace("\n", " ") == answer["text"]))
                assert abs(answer["score"] - want[k]) <= 1e-4
            assert found[0]["score"] == pytest.approx(float(want.max()), abs=1e-4)
    again = search(model, docs, "--backend", backend, "--top", "2", "--index", str(tmp_path / "index"))
    assert again["index"] == "loaded" and again["answers"] == result["answers"]
