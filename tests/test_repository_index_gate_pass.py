"""The first index runs the exact model over the calibration text once where the contexts allow it.

The gate's walk needs the exact model's log-probs on windows of WINDOW tokens of the calibration
text; the labels need its argmax on chunks of CONTEXT_LENGTH tokens of each calibration file. A
window begins with the same tokens as a chunk wherever a chunk starts a window, and there the
distributions are the same: the labels read them from the gate's pass, which runs first and which
the gate's walk takes instead of running the model again. The labels and the gate equal those of
the two separate passes.
"""

from __future__ import annotations

import functools
import uuid

import numpy as np
import psycopg
import pytest

from generation_helpers import drop_atom_set
from hartonomous.augment.calibrate import calibration_windows, fit_set_gate
from hartonomous.augment.gates import load_gate
from hartonomous.repository.index import entries_for, index_repository
from hartonomous.repository.split import file_split
from projection import stages
from projection.index import (CONTEXT_LENGTH, first_index, gate_pass, index_options, label_from_gate_pass,
                              repository_texts)
from projection.progress import Reporter
from repository_helpers import initial_files, module_text, write_repository
from tiny_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LONG = "pkg/mod_23.py"  # the first calibration file (by its path's hash), of several windows


def files() -> dict[str, str]:
    out = initial_files()
    out[LONG] = module_text(23, functions=40)
    return out


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    assert file_split(LONG) == "calibration"
    return write_repository(tmp_path_factory.mktemp("repo") / "gatepass", files())


def loaded_texts(root, model, tokenizer):
    from hartonomous.repository.files import walk_repository
    from hartonomous.repository.split import unique_contents

    kept, _ = unique_contents(walk_repository(root).files)
    entries = entries_for(root, kept, tokenizer)
    texts = repository_texts(root, entries, {f.path: f.text for f in kept}, CONTEXT_LENGTH)
    embeddings = model.get_input_embeddings().weight.detach().float().numpy()
    return stages.Loaded(model, tokenizer, "tiny", embeddings, texts)


def covered_chunks(chunks, windows) -> list[int]:
    return [i for i, c in enumerate(chunks)
            if any(len(w) >= len(c) and np.array_equal(w[:len(c)], c) for w in windows)]


def test_the_labels_read_from_the_gate_pass_are_the_labels_of_their_own_pass(repository):
    model, tokenizer = tiny_model(0)
    loaded = loaded_texts(repository, model, tokenizer)
    options = index_options("gate-pass", "tiny", True, False, 64)
    windows = calibration_windows(loaded.texts.calibration_text, tokenizer)
    assert len(windows) >= 2 and len(covered_chunks(loaded.texts.calibration_chunks, windows)) >= 2

    reused = label_from_gate_pass(options, loaded, Reporter(), gate_pass(loaded, Reporter()))
    own = stages.label(options, loaded, Reporter())

    assert len(reused.calibration_argmax) == len(own.calibration_argmax)
    for a, b in zip(reused.calibration_argmax, own.calibration_argmax):
        assert np.array_equal(a, b)
    assert np.array_equal(reused.calibration_targets, own.calibration_targets)


def test_the_first_index_runs_the_model_over_a_covered_chunk_only_in_the_gate_pass(server_url, repository):
    model, tokenizer = tiny_model(0)
    forwarded: list[int] = []
    hook = model.base_model.register_forward_pre_hook(
        lambda _m, _args, kwargs: forwarded.append(int(kwargs["input_ids"].numel())), with_kwargs=True)
    name = f"gp-{uuid.uuid4().hex[:8]}"
    try:
        index_repository(repository, name, first_index=functools.partial(first_index, model_obj=model,
                                                                         tokenizer=tokenizer, landmarks=64),
                         model="tiny", tokenizer=tokenizer, database_url=server_url, progress=False)
    finally:
        hook.remove()
    try:
        texts = loaded_texts(repository, model, tokenizer).texts
        chunks = texts.calibration_chunks
        windows = calibration_windows(texts.calibration_text, tokenizer)
        covered = covered_chunks(chunks, windows)
        window_tokens = sum(map(len, windows))
        label_tokens = sum(map(len, chunks))
        uncovered = sum(len(c) for i, c in enumerate(chunks) if i not in covered)
        probe = min(len(chunks[i]) for i in covered)
        # the gate's windows once, the chunks no window begins with, one covered chunk run alone to
        # check that a window's prefix has the chunk's own bits; the two separate passes ran more
        assert sum(forwarded) == window_tokens + uncovered + probe
        assert sum(forwarded) < window_tokens + label_tokens

        with psycopg.connect(server_url) as conn:
            stored = load_gate(conn, name)
            refitted = fit_set_gate(conn, name, model=model, tokenizer=tokenizer)   # its own pass, as before
            conn.rollback()
        assert (stored.means, stored.scales, stored.coefficients, stored.intercept) == \
               (refitted.means, refitted.scales, refitted.coefficients, refitted.intercept)
        assert (stored.calibration_loss, stored.exact_loss, stored.positions) == \
               (refitted.calibration_loss, refitted.exact_loss, refitted.positions)
    finally:
        drop_atom_set(server_url, name)
