"""Steps batched across sequences (issue 45 part 3): option decoder ``batch`` runs the batch form of the export, a
``BatchGenerator`` keeps each sequence's cache as a row of one pooled buffer and runs their steps as one run. Rows of
a batch give the same greedy tokens as the same sequences alone (before a near-tie), on the Concat and the
GroupQueryAttention forms, with sequences joining and leaving, rows idle while others step, and shapes pinned; the
batch form is checked against the export row by row before use, and that check catches rows that see each other's
positions."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from npurt import Generator, NpuError, NpuUnsupportedError, RunnerFactory, StatusCode
from npurt.generate import layout, static_form, verify_child
from npurt.generate.batch import BatchGenerator, greedy_batch
from tests.helpers.decoders import MODEL_FILE, assert_tokens_agree, form_folder, greedy_onnxruntime

NEW_TOKENS = 24
MORE = 6  # the references run this much longer: sequences idle for a while go on after the others
DECODER = {"max_length": 96, "prefill_chunk": 4, "batch": [1, 2, 4, 8]}
# prompts of other lengths (so other positions in every step), ids under every test vocabulary
PROMPTS = [[(13 * i + 7 * k + 5) % 300 + 3 for i in range(2 + 3 * k)] for k in range(6)]
FORMS = [("gqa", "standard"), ("nopos", "standard"), ("gqa", "builder")]  # Concat (position ids or none), GQA


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("batch")


def batch_runner(backend: str, folder, **options):
    device = "NPU" if backend == "QNN" else "CPU"
    return RunnerFactory.create_runner(backend, folder / MODEL_FILE,
                                       {"device": device, "decoder": DECODER, **options})


@pytest.fixture(scope="module")
def references(root):
    """Per form, each prompt's greedy run alone on plain ONNX Runtime over the export."""
    return {(shape, form): [greedy_onnxruntime(form_folder(root, shape, form) / MODEL_FILE, p, NEW_TOKENS + MORE)
                            for p in PROMPTS] for shape, form in FORMS}


@pytest.mark.parametrize("backend", ["ONNXRUNTIME", "VAIML"])
@pytest.mark.parametrize(("shape", "form"), FORMS)
def test_rows_give_the_tokens_of_each_sequence_alone(root, references, shape, form, backend):
    """Six sequences prefilled into their rows, then every step batched (an 8-row run, two rows idle): each row's
    tokens are its sequence's alone; the pooled cache is the engine's input and output (no host copy)."""
    with batch_runner(backend, form_folder(root, shape, form)) as r:
        assert r.decoder.batch == (1, 2, 4, 8)
        assert "8 rows batched (one idle), each against the export alone" in r.decoder.verification
        assert r.decoder.attention == (layout.GROUP_QUERY if form == "builder" else layout.CONCAT)
        with BatchGenerator(r) as batch:
            got = greedy_batch(batch, PROMPTS, NEW_TOKENS)
            assert batch.stats["steps"] == NEW_TOKENS - 1
            assert batch.stats["rows_run"] == 8 * (NEW_TOKENS - 1)  # rows 0..5 stepped: the 8-row run
        assert r.stats["copies"] == 0
    for k, (tokens, reference) in enumerate(zip(got, references[(shape, form)])):
        assert_tokens_agree(tokens, _prefix(reference, NEW_TOKENS), f"{backend} {shape} {form}: row {k} of the batch")


@pytest.mark.parametrize(("shape", "form"), [("gqa", "standard"), ("gqa", "builder")])
def test_sequences_join_leave_and_idle(root, references, shape, form):
    """Sequences join (a prompt prefilled in chunks into a row freed by one that left, its stale cache below them),
    leave mid-way, and sit idle while others step (their rows run a pad at their own position): every sequence's
    tokens are still its own alone. Runs pick the smallest batch size that holds the rows stepped."""
    refs = references[(shape, form)]
    with batch_runner("ONNXRUNTIME", form_folder(root, shape, form)) as r, BatchGenerator(r) as batch:
        made: dict = {}
        next_id: dict = {}

        def join(k: int, chunk: int | None = None):
            seq = batch.open()
            next_id[seq] = int(np.argmax(seq.append(PROMPTS[k], chunk=chunk)))
            made[seq] = (k, [next_id[seq]])
            return seq

        def step(seqs) -> None:
            logits = batch.step({seq: next_id[seq] for seq in seqs})
            for seq, row in logits.items():
                next_id[seq] = int(np.argmax(row))
                made[seq][1].append(next_id[seq])

        a, b = join(0), join(1)
        assert (a.row, b.row) == (0, 1)
        for _ in range(5):
            step([a, b])
        assert batch.stats["rows_run"] == 2 * 5  # the 2-row run
        c = join(2, chunk=3)  # row 2, prefilled in chunks between steps
        for _ in range(4):
            step([b, c])  # a idle at its own position (the 4-row run)
        a.close()  # a leaves with 6 of its tokens
        assert not a.open
        d = join(3, chunk=2)  # in row 0, over a's cache
        assert d.row == 0
        while len(made[d][1]) < NEW_TOKENS:
            step([s for s in (b, c, d) if len(made[s][1]) < NEW_TOKENS])
        e = join(4)
        assert e.row == 3
        while len(made[e][1]) < NEW_TOKENS + MORE:
            step([e])  # alone in row 3: the 4-row run, b, c and d idle at their own positions
        while len(made[b][1]) < NEW_TOKENS + MORE:  # b, c and d go on after being idle that long
            step([s for s in (b, c, d) if len(made[s][1]) < NEW_TOKENS + MORE])
        for seq, (k, tokens) in made.items():
            assert_tokens_agree(tokens, _prefix(refs[k], len(tokens)), f"{form}: sequence {k} in row {seq.row}")
            if seq is not a:
                assert len(tokens) == NEW_TOKENS + MORE
                assert seq.tokens == tuple(PROMPTS[k] + tokens[:-1])


def test_rows_move_down_when_sequences_leave(root, references):
    """Four sequences in rows 0-3; three leave: the one left is moved into row 0 (one copy of its cache) and steps
    as the 1-row run; its tokens are still its own alone, and so are those of a sequence joining after it."""
    refs = references[("gqa", "builder")]
    with batch_runner("ONNXRUNTIME", form_folder(root, "gqa", "builder")) as r, BatchGenerator(r) as batch:
        seqs = [batch.open() for _ in range(4)]
        ids = {seq: int(np.argmax(seq.append(PROMPTS[k]))) for k, seq in enumerate(seqs)}
        made = {seq: [ids[seq]] for seq in seqs}
        for _ in range(4):
            ids = {seq: int(np.argmax(row)) for seq, row in batch.step(ids).items()}
            for seq, token in ids.items():
                made[seq].append(token)
        last = seqs[3]
        for seq in seqs[:3]:
            seq.close()
        run_before = batch.stats["rows_run"]
        token = ids[last]
        while len(made[last]) < NEW_TOKENS:
            token = int(np.argmax(batch.step({last: token})[last]))
            made[last].append(token)
        assert last.row == 0 and batch.stats["rows_moved"] == 1
        assert batch.stats["rows_run"] - run_before == NEW_TOKENS - 5  # the 1-row run
        joined = batch.open()
        assert joined.row == 1
        late = [int(np.argmax(joined.append(PROMPTS[5])))]
        while len(late) < NEW_TOKENS:
            late.append(int(np.argmax(batch.step({joined: late[-1]})[joined])))
    assert_tokens_agree(made[last], _prefix(refs[3], NEW_TOKENS), "the sequence moved to row 0")
    assert_tokens_agree(late, _prefix(refs[5], NEW_TOKENS), "a sequence joining after the move")


def test_several_pools_over_one_runner(root, references):
    """Where a larger run does not pay (int4 on the CPU), several 2-row BatchGenerators over one runner, stepped in
    turn: each has a pool of its own, and every sequence keeps its own tokens."""
    refs = references[("gqa", "standard")]
    with batch_runner("ONNXRUNTIME", form_folder(root, "gqa", "standard")) as r:
        pools = [BatchGenerator(r, rows=2), BatchGenerator(r, rows=2)]
        seqs = [pool.open() for pool in pools for _ in range(2)]
        ids = {seq: int(np.argmax(seq.append(PROMPTS[k]))) for k, seq in enumerate(seqs)}
        made = {seq: [ids[seq]] for seq in seqs}
        for _ in range(NEW_TOKENS - 1):
            for pool in pools:
                for seq, row in pool.step({seq: ids[seq] for seq in pool.active}).items():
                    ids[seq] = int(np.argmax(row))
                    made[seq].append(ids[seq])
        assert [pool.stats["rows_run"] for pool in pools] == [2 * (NEW_TOKENS - 1)] * 2
        for pool in pools:
            pool.close()
    for k, seq in enumerate(seqs):
        assert_tokens_agree(made[seq], _prefix(refs[k], NEW_TOKENS), f"sequence {k} in pool {k // 2}")


def _prefix(reference, n: int):
    """The reference cut to its first ``n`` tokens."""
    return type(reference)(tokens=reference.tokens[:n], logits=reference.logits[:n], gaps=reference.gaps[:n])


@pytest.mark.parametrize(("shape", "form"), [("gqa", "standard"), ("gqa", "builder")])
def test_pinned_batch_sizes(root, references, shape, form):
    """Shapes pinned (as on an NPU): the prefill chunk, the step and each batch size are signatures of one graph;
    batched rows still give each sequence's tokens; a plain Generator runs over the same runner."""
    with batch_runner("VAIML", form_folder(root, shape, form), static_shapes=True) as r:
        assert r.decoder.pinned
        with BatchGenerator(r, rows=4) as batch:
            got = greedy_batch(batch, PROMPTS[:3], NEW_TOKENS)
            assert batch.stats["rows_run"] == 4 * (NEW_TOKENS - 1)
            seq = batch.open()  # row 0 again, over the last sequence's cache: a loop of its own (a Generator's)
            assert seq.row == 0
            own = seq.generate(PROMPTS[4], NEW_TOKENS)
        with Generator(r) as gen:
            alone = gen.generate(PROMPTS[3], NEW_TOKENS)
    for k, tokens in enumerate(got):
        assert_tokens_agree(tokens, _prefix(references[(shape, form)][k], NEW_TOKENS), f"pinned {form}: row {k}")
    assert_tokens_agree(alone, _prefix(references[(shape, form)][3], NEW_TOKENS),
                        f"pinned {form}: a Generator on the batch runner")
    assert_tokens_agree(own, _prefix(references[(shape, form)][4], NEW_TOKENS), f"pinned {form}: a row's own loop")


def test_the_htp_emulator(root, references):
    """QNN on the HTP emulator at FP16: every node of the Concat batch form on the HTP, the prefill chunk, the step
    and the 4-row step three static shapes of one graph (three compiles), rows' tokens each sequence's alone up to a
    step whose top-2 gap is under 0.12 (twice FP16's logit error, tests/test_generate.py)."""
    from tests.helpers.qnn import require_qnn

    require_qnn()
    with batch_runner("QNN", form_folder(root, "gqa", "standard"),
                      decoder={"max_length": 48, "prefill_chunk": 4, "batch": [1, 4]}) as r:
        assert {p.device for p in r.placement} == {"QNNExecutionProvider"}, [
            (p.node, p.op_type, p.reason) for p in r.placement if p.device != "QNNExecutionProvider"]
        with BatchGenerator(r) as batch:
            got = greedy_batch(batch, PROMPTS[:3], 16)
        assert r.stats["compiles"] == 3 and r.stats["copies"] == 0
    for k, tokens in enumerate(got):
        assert_tokens_agree(tokens, _prefix(references[("gqa", "standard")][k], 16), f"QNN row {k}", tolerance=0.12)


def test_bad_input_is_refused(root):
    folder = form_folder(root, "gqa", "standard")
    with pytest.raises(ValueError, match="batch"):
        RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE,
                                    {"device": "CPU", "decoder": {"max_length": 32, "batch": 4}})
    with pytest.raises(ValueError, match="positive integer"):
        RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE,
                                    {"device": "CPU", "decoder": {"max_length": 32, "batch": [2, 0]}})
    with pytest.raises(NpuUnsupportedError, match="ONNX Runtime backends"):
        RunnerFactory.create_runner("OPENVINO", folder / MODEL_FILE,
                                    {"device": "CPU", "decoder": {"max_length": 32, "batch": [2]}})
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE,
                                     {"device": "CPU", "decoder": {"max_length": 32}}) as plain:
        with pytest.raises(ValueError, match="batch sizes"):
            BatchGenerator(plain)
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE,
                                     {"device": "CPU", "decoder": {"max_length": 8, "batch": [1, 2]}}) as r:
        with pytest.raises(ValueError, match="rows"):
            BatchGenerator(r, rows=3)
        with BatchGenerator(r) as batch, BatchGenerator(r, rows=1) as other:
            a, b = batch.open(), batch.open()
            with pytest.raises(NpuError, match="all 2 rows"):
                batch.open()
            a.append([5, 6, 7])
            stranger = other.open()
            with pytest.raises(ValueError, match="not an open row of this batch"):
                batch.step({stranger: 3})
            with pytest.raises(ValueError, match="vocabulary"):
                batch.step({a: 10_000})
            before = a.tokens
            b.close()
            with pytest.raises(ValueError, match="not an open row"):
                batch.step({b: 3})
            with pytest.raises(NpuError, match="closed"):
                b.append([3])
            assert a.tokens == before  # nothing ran
            a.append([1] * 5)  # 8 ids: the row is full
            with pytest.raises(ValueError, match="max_length"):
                batch.step({a: 3})


def test_shared_stream_state(root):
    """Stream.share_state: a stream's cache is the caller's array itself (a run writes there), and what it
    cannot be is refused with INVALID_INPUT: another dtype, rank or fixed dim, memory not contiguous, a name not
    carried, a runner whose state changes buffers every run."""
    folder = form_folder(root, "gqa", "standard")
    with RunnerFactory.create_runner("ONNXRUNTIME", folder / MODEL_FILE,
                                     {"device": "CPU", "decoder": {"max_length": 16}}) as r:
        names = list(r.options.state_pairs)
        facts = r.decoder
        cache = {n: np.zeros((1, facts.kv_heads, 16, facts.head_dim), np.float32) for n in names}
        with Generator(r) as gen:
            assert gen._stream.share_state(cache) is StatusCode.SUCCESS
            gen.append([5, 6, 7])
            assert all(np.abs(a[0, :, :3]).max() > 0 and not a[0, :, 3:].any() for a in cache.values())
            state = r.get_stream_state(gen._stream)
            assert all(np.array_equal(state[n], cache[n]) for n in names)
            wide = np.zeros((2, facts.kv_heads, 16, facts.head_dim), np.float32)
            bad = {"dtype": {names[0]: cache[names[0]].astype(np.float64)},
                   "rank": {names[0]: cache[names[0]][0]},
                   "contiguous": {names[0]: wide[:, :, ::2]},
                   "shape": {names[0]: wide},
                   "name": {"nope": cache[names[0]]}}
            for what, arrays in bad.items():
                assert gen._stream.share_state(arrays) is StatusCode.INVALID_INPUT, what
                assert "Stream.share_state" in r.last_error
    from tests.helpers.models import model_or_skip

    vad = model_or_skip("silero_vad")  # its state pair takes turns between two buffers: nothing to share
    with RunnerFactory.create_runner("VAIML", vad, {"device": "CPU", "state_pairs": {"state": "stateN"}}) as r:
        stream = r.open_stream()
        assert stream.share_state({"state": np.zeros((2, 1, 128), np.float32)}) is StatusCode.INVALID_INPUT
        assert "only state kept in place" in r.last_error


def test_the_batch_check_catches_rows_that_share_a_position(root, tmp_path):
    """A batch form whose rows all take the first row's position passes every check of one row, and fails the
    batched check (each row against the export alone): the check this runner's verdict rests on can fail."""
    folder = form_folder(root, "gqa", "standard")
    model = onnx.load(str(folder / MODEL_FILE))
    derived = static_form.derive(model, 48, batch=None)
    form, form_layout = derived.model, derived.layout
    graph = form.graph
    same = "position__first_row"  # what every node reads instead of the position input
    for node in graph.node:
        node.input[:] = [same if name == layout.POSITION else name for name in node.input]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "first_row"))
    nodes = [helper.make_node("Shape", [layout.POSITION], ["rows_shape"]),
             helper.make_node("Gather", [layout.POSITION, "first_row"], ["first_position"], axis=0),
             helper.make_node("Expand", ["first_position", "rows_shape"], [same]), *graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(form.SerializeToString())
    prompt = [(7 * i + 3) % 512 for i in range(7)]
    args = {"export": str(folder / MODEL_FILE), "derived": str(bad), "engine": "onnxruntime", "prompt": prompt,
            "steps": 4, "chunk": 4, "max_length": 48, "pad": 0, "tolerance": 1e-3, "engine_options": {},
            "kv_heads": form_layout.pairs[0].shape[1], "head_dim": form_layout.pairs[0].shape[3]}
    verdicts = {}
    for batch in (1, 4):
        done = subprocess.run([sys.executable, verify_child.__file__, json.dumps({**args, "batch": batch})],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        verdicts[batch] = json.loads(done.stdout.strip().splitlines()[-1])
    assert verdicts[1]["ok"], verdicts[1]
    assert not verdicts[4]["ok"] and "batched step" in verdicts[4]["where"], verdicts[4]
