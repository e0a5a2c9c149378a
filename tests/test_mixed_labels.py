"""--target mixed: where the teacher's chunks end, and the labels the counting baselines learn from."""

from __future__ import annotations

import numpy as np

from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.labels import from_corpus, from_soft, mixed, teacher_chunk_count


def test_the_teacher_labels_the_fewest_whole_chunks_that_hold_its_tokens() -> None:
    chunks = [np.arange(10), np.arange(10), np.arange(5)]
    assert teacher_chunk_count(chunks, 0) == 0
    assert teacher_chunk_count(chunks, 1) == 1
    assert teacher_chunk_count(chunks, 10) == 1
    assert teacher_chunk_count(chunks, 11) == 2
    assert teacher_chunk_count(chunks, 10_000) == 3


def test_mixed_labels_pad_the_corpus_rows_with_weightless_columns() -> None:
    taught_chunks = [np.array([1, 2, 3])]
    top_ids = [np.array([[5, 6], [7, 8], [9, 9]])]
    top_probs = [np.array([[0.6, 0.4], [0.9, 0.1], [1.0, 0.0]])]
    rest = [np.array([1, 2, 4, 1, 2])]
    labels = mixed(from_soft(taught_chunks, top_ids, top_probs), from_corpus(rest))
    assert labels.target == "mixed" and labels.k == 2 and labels.positions == 2 + 4
    assert labels.ids[1].tolist() == [[2, 0], [4, 0], [1, 0], [2, 0]]
    assert labels.mass[1][:, 1].tolist() == [0, 0, 0, 0]
    # after "1 2": the teacher's 0.9 / 0.1 on 7 / 8, the corpus's 4 once: the ∞-gram sums both
    dist = InfiniGram(labels).predict([1, 2])
    got = dict(zip(dist.ids.tolist(), dist.probs.tolist()))
    assert got[4] > 0 and got[7] > got[8] > 0
    assert abs(sum(got.values()) - 1.0) < 1e-9
