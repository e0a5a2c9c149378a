"""The forwards' thread count: a given count between 1 and the cores, or all the cores less the
other processes running, chosen before each prompt (a busy neighbour made two OpenMP threads on
two cores 4-10x slower than one: docs/runtimes.md, "Threads under load")."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from hartonomous.errors import UserError
from hartonomous.runtimes.threads import ThreadPolicy, busy_neighbours, check_threads, cores
from hartonomous.server.runtime import SharedModel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("bad", [0, -1, cores() + 1])
def test_a_thread_count_outside_one_to_the_cores_is_refused_naming_the_option(bad):
    with pytest.raises(UserError, match=rf"--threads must be between 1 and {cores()}.*got {bad}"):
        check_threads(bad)
    with pytest.raises(UserError):
        ThreadPolicy(bad)


@pytest.mark.parametrize("command", [["serve"], ["generate", "def f():"]])
def test_serve_and_generate_refuse_a_bad_thread_count_in_one_line_before_they_connect(command):
    done = subprocess.run([sys.executable, "-m", "hartonomous.cli", *command, "--threads", str(cores() + 1)],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "HARTONOMOUS_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert done.returncode != 0
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "--threads must be between 1 and" in lines[0]


def test_a_given_count_is_kept_and_set_before_each_prompt():
    class Model:
        def prefill(self, ids, cache):
            return torch.get_num_threads()

    before = torch.get_num_threads()
    try:
        assert SharedModel(Model(), ThreadPolicy(1)).prefill([1], None) == 1
        assert ThreadPolicy(cores()).choose() == cores()
    finally:
        torch.set_num_threads(before)


def test_the_default_leaves_a_core_to_a_busy_neighbour():
    """While another process spins, the adaptive count is below the cores (the least of a few
    samples: the neighbour may be between time slices at one of them); alone, never above them."""
    assert 1 <= ThreadPolicy().choose() <= cores()
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = []
        for _ in range(20):
            seen.append((busy_neighbours(), ThreadPolicy().choose()))
            time.sleep(0.01)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert max(busy for busy, _ in seen) >= 1
    assert min(chosen for _, chosen in seen) <= max(1, cores() - 1)
