"""npurt.Embedder on Qualcomm's HTP emulator (RunnerType.QNN, device NPU): a batch shape on an NPU can be computed
wrong and still return SUCCESS, and the Embedder's bucket verification catches it.

The emulator computes the rows of a [2, 16] BERT batch otherwise than each row alone (all-MiniLM-L6-v2 in issue
59, and the random-weight BERT here, whose compile takes seconds, not a minute): raw ONNX Runtime + QNN EP on the
static form shows the fault itself; the Embedder refuses the bucket and runs one row at a time, saying so, or raises
where asked to."""

from __future__ import annotations

import numpy as np
import pytest

from npurt import Embedder, NpuError
from npurt.embed import BucketWarning
from npurt.models.bert import write_bert
from npurt.onnx_edit import static_model
from tests.helpers.qnn import QNN_OPTIONS, raw_qnn_session, require_qnn

QUIET = {"log_level": "ERROR"}
TEXTS = ["hello world", "kaloru mine tion pre con", "the quick brown fox", "ab"]


@pytest.fixture(scope="module")
def qnn_available():
    require_qnn()


pytestmark = pytest.mark.usefixtures("qnn_available")


def test_a_batch_shape_the_htp_computes_wrong_is_caught_and_run_one_row_at_a_time(tmp_path):
    folder = write_bert(tmp_path / "bert")
    ids = np.zeros((2, 16), np.int64)
    mask = np.zeros((2, 16), np.int64)
    ids[0, :16], mask[0, :16] = np.arange(10, 26), 1
    ids[1, :9], mask[1, :9] = np.arange(40, 49), 1
    # the fault is the device's: raw ONNX Runtime + QNN EP, row 1 of [2, 16] against the same row in [1, 16]
    rows = []
    for batch in (2, 1):
        shapes = {n: [batch, 16] for n in ("input_ids", "attention_mask", "token_type_ids")}
        session = raw_qnn_session(str(static_model(folder / "onnx" / "model.onnx", shapes,
                                                   tmp_path / f"static{batch}.onnx")), QNN_OPTIONS)
        feeds = {"input_ids": ids[-batch:], "attention_mask": mask[-batch:],
                 "token_type_ids": np.zeros_like(ids[-batch:])}
        rows.append(session.run(None, feeds)[0][-1, :9].ravel().astype(np.float64))
    raw_cosine = rows[0] @ rows[1] / np.linalg.norm(rows[0]) / np.linalg.norm(rows[1])
    assert raw_cosine < 0.999, f"raw ONNX Runtime + QNN computes [2, 16] right now ({raw_cosine}): the fault is gone"

    with pytest.warns(BucketWarning, match=r"bucket \[2, 16\]: WRONG"):
        embedder = Embedder(folder, "QNN", "NPU", options=QUIET, buckets=[(2, 16)], max_length=16)
    with embedder, Embedder(folder, "ONNXRUNTIME", "CPU", max_length=16) as cpu:
        assert embedder.runner.device_info.attached == "NPU"
        assert embedder.buckets == [(1, 16)]
        (check,) = embedder.bucket_checks
        assert check.shape == (2, 16) and not check.ok and check.cosine < 0.999
        assert any("one row at a time" in line for line in embedder.describe())
        got = embedder.encode(TEXTS)
        assert [b.shape for b in embedder.last_batches] == [(1, 16)] * len(TEXTS)
        want = cpu.encode(TEXTS)
        assert (got * want).sum(1).min() >= 0.9999  # the HTP's FP16 against float32 on the CPU
    with pytest.raises(NpuError, match=r"computes batch rows wrong: bucket \[2, 16\]: WRONG"):
        Embedder(folder, "QNN", "NPU", options=QUIET, buckets=[(2, 16)], max_length=16, on_wrong_bucket="error")
