"""The benchmark suite's behaviour on a tiny run: what it writes, not how fast anything is."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import run, synthetic
from hartonomous.atomset.hilbert import hilbert_codes_of_cells, hilbert_order
from hartonomous.measure import MACHINE_KEYS
from generation_helpers import run_cli

LATENCY_FIELDS = {
    "atom_set", "atoms", "max_neighbors", "calls", "in_db_p50_ms", "in_db_p95_ms", "roundtrip_p50_ms",
    "roundtrip_p95_ms", "shared_buffers_p50", "shared_buffers_p95", "shared_buffers_max", "in_db_cpu_ms",
    "in_db_round_p50_ms",
    "explain_p50_ms", "buffers_by_relation", "brute_force_calls", "brute_force_p50_ms", "index_speedup",
    "load_1m",
}


@pytest.fixture(scope="module")
def tiny_results(server_url):
    return run.run(server_url, sizes=(400,), calls=20, brute_calls=2, concurrency_seconds=1.0,
                   concurrency_levels=(1, 2), generation=False, real_sets=())


def test_tiny_run_has_the_documented_fields(tiny_results):
    r = tiny_results
    assert {"mode", "started", "finished", "machine", "sizes", "load_1m", "method", "latency", "ingest",
            "concurrency", "targets", "throughput_note"} <= set(r)
    assert r["sizes"] == [400]
    assert tuple(r["machine"]) == MACHINE_KEYS  # the same keys as a compare report's machine
    assert r["machine"]["postgresql"] and r["machine"]["server_settings"]["jit"] in ("on", "off")
    assert r["machine"]["exact_device"] is None and r["machine"]["exact_model"] is None  # no generation run
    (lat,) = r["latency"]
    assert set(lat) == LATENCY_FIELDS
    assert lat["atom_set"] == synthetic.synthetic_name(400) and lat["atoms"] == 400 and lat["calls"] == 20
    assert 0 < lat["in_db_p50_ms"] <= lat["in_db_p95_ms"]
    assert lat["shared_buffers_p50"] > 0 and lat["brute_force_calls"] == 2 and lat["index_speedup"] > 0
    assert {"atoms heap", "atoms GiST index"} <= set(lat["buffers_by_relation"])
    (ingest,) = r["ingest"]
    assert ingest["atoms"] == 400 and ingest["index_build_s"] >= 0 and ingest["built"] == "this run"
    assert [c["clients"] for c in r["concurrency"]] == [1, 2]
    assert all(c["calls"] > 0 and not c["errors"] for c in r["concurrency"])
    assert [t["what"] for t in r["targets"]][0].startswith("next_token at 10^6")
    for t in r["targets"]:
        assert {"what", "target", "measured", "unit", "met", "limit"} <= set(t)
        assert t["measured"] is None and t["met"] is None  # no 10^6 set, no generation: not measured


def test_write_produces_json_and_markdown(tiny_results, tmp_path):
    json_path, md_path = run.write(tiny_results, tmp_path / "bench", "hartonomous bench --sizes 400")
    data = json.loads(json_path.read_text())
    assert data["command"] == "hartonomous bench --sizes 400" and data["latency"][0]["atoms"] == 400
    md = md_path.read_text()
    for heading in ("### next_token latency", "### Ingest", "### Concurrency", "### Targets"):
        assert heading in md
    assert "not measured" in md and "generation throughput not measured" in md


def test_existing_set_with_the_current_layout_is_reused(server_url, tiny_results):
    import psycopg

    with psycopg.connect(server_url) as conn:
        assert synthetic.ensure_synthetic_atom_set(conn, 400) is None
        assert synthetic.stored_ingest(conn, synthetic.synthetic_name(400))["atoms"] == 400
        window = conn.execute("SELECT centroid_window FROM atom_sets WHERE name = %s",
                              (synthetic.synthetic_name(400),)).fetchone()[0]
    assert window == 1


@pytest.mark.parametrize("args, message", [
    (["--quick", "--full"], "--quick and --full exclude each other"),
    (["--sizes", "ten"], "--sizes must be comma-separated atom counts"),
    (["--sizes", "5"], "--sizes must be atom counts between 100 and 1e8"),
    (["--calls", "3"], "--calls must be at least 20"),
    (["--brute-calls", "0"], "--brute-calls must be at least 1"),
    (["--concurrency-seconds", "0.5"], "--concurrency-seconds must be at least 1"),
    (["--speculative", "--full"], "--speculative without --quick is its full size"),
    (["--speculative", "--threads", "0"], "--threads must be at least 1"),
    (["--speculative", "--runtimes", "int8"], "--runtimes takes int4 and llama"),
    (["--speculative", "--draft-tokens", "65"], "--draft-tokens must be between 1 and 64"),
])
def test_bad_options_give_one_line(capsys, args, message):
    code, _, err = run_cli(capsys, "bench", *args)
    assert code == 1 and err.count("\n") == 1 and message in err


def test_help_explains_the_command(capsys):
    code, out, _ = run_cli(capsys, "bench", "--help")
    assert code == 0
    out = " ".join(out.split())  # the help is re-wrapped to the terminal's width
    for text in ("--quick", "--full", "--no-generation", "--sizes", "clock_timestamp", "brute force"):
        assert text in out


def test_hilbert_order_visits_grid_neighbours():
    cells = np.array([(x, y, z) for x in range(8) for y in range(8) for z in range(8)])
    codes = hilbert_codes_of_cells(cells, 3)
    assert sorted(codes.tolist()) == list(range(512))
    walk = cells[np.argsort(codes)]
    assert np.all(np.abs(np.diff(walk, axis=0)).sum(axis=1) == 1)  # every step moves to a face neighbour
    points = np.random.default_rng(0).random((1000, 3))
    assert sorted(hilbert_order(points).tolist()) == list(range(1000))


# -- bench --speculative: the parts that need no SmolLM2 -----------------------------------------

def test_document_prompts_are_the_longest_test_segments_cut_to_the_prompt_length():
    from benchmarks.speculative import document_prompts
    from hartonomous.splits import SEPARATOR
    from tiny_model import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    short, long_, longer = "a b c " * 10, "the cat sat on the mat. " * 20, "def f(x): return x + 1\n" * 30
    prompts = document_prompts(SEPARATOR.join([short, long_, longer]), tokenizer, count=2, prompt_tokens=40)
    assert longer.startswith(prompts[0][:20]) and long_.startswith(prompts[1][:20])
    assert len(prompts) == 2 and all(len(tokenizer.encode(p)) <= 41 for p in prompts)


def test_repeated_requests_ask_every_template_prompt_twice_the_second_time_in_another_order():
    from benchmarks.speculative import repeated_prompts

    prompts = repeated_prompts(templates=2, fills=3)
    first, second = prompts[:6], prompts[6:]
    assert len(set(first)) == 6 and sorted(first) == sorted(second) and first != second
    assert repeated_prompts(templates=2, fills=3) == prompts          # a fixed order


def test_speculative_targets_and_markdown_say_what_was_met():
    from benchmarks.speculative import METHODS, MethodTotals, markdown, targets
    from hartonomous.speculative.decoding import SpeculativeStats

    def kind(ms: dict, rate: float) -> dict:
        totals = {m: MethodTotals(seconds=ms[m] * 64 / 1000, tokens=64, identical=1, prompts=1) for m in METHODS}
        totals["speculative"].add_drafting(SpeculativeStats(drafted=40, accepted=int(40 * rate), forwards=30))
        base = totals["transformers_generate"].row(None)["ms_per_token"]
        return {"prompts": 1, "prompt_tokens": [10], "methods": {m: totals[m].row(base) for m in METHODS}}

    kinds = {"short": kind({"transformers_generate": 60, "prompt_lookup": 55, "exact": 58, "speculative": 52,
                            "speculative_schedule": 59, "speculative_memory": 48, "speculative_tree": 51}, 0.1),
             "document": kind({"transformers_generate": 60, "prompt_lookup": 30, "exact": 58, "speculative": 35,
                               "speculative_schedule": 45, "speculative_memory": 36, "speculative_tree": 33}, 0.5),
             "repeated": kind({"transformers_generate": 60, "prompt_lookup": 45, "exact": 58, "speculative": 50,
                               "speculative_schedule": 52, "speculative_memory": 30, "speculative_tree": 49}, 0.3)}
    kinds["document"]["methods"]["speculative_memory"]["all_identical"] = False
    met = {t["what"]: t["met"] for t in targets(kinds)}
    assert met == {"short: speculative vs transformers generate": False,       # 1.15x < 1.2x
                   "short: speculative vs prompt lookup": True,
                   "short: speculative identical to transformers greedy": True,
                   "short: speculative_tree identical to transformers greedy": True,
                   "short: speculative_memory identical to transformers greedy": True,
                   "document: speculative vs transformers generate": True,
                   "document: speculative vs prompt lookup": False,
                   "document: speculative identical to transformers greedy": True,
                   "document: speculative_tree identical to transformers greedy": True,
                   "document: speculative_memory identical to transformers greedy": False,
                   "repeated: speculative_memory vs transformers generate": True,   # memory on: 2.0x
                   "repeated: speculative_memory vs prompt lookup": True,
                   "repeated: speculative identical to transformers greedy": True,
                   "repeated: speculative_tree identical to transformers greedy": True,
                   "repeated: speculative_memory identical to transformers greedy": True,
                   "document: acceptance rate": True}
    assert kinds["document"]["methods"]["speculative"]["tokens_per_forward"] == pytest.approx(64 / 30)
    results = {"mode": "speculative-quick", "machine": {"cpu": "x", "cores": 2, "load_average": [1, 1, 1]},
               "torch_threads": 2, "atom_set": "s", "max_new_tokens": 64, "draft_tokens": 4,
               "prompt_lookup_num_tokens": 3, "forward_costs": {"prefix": 128, "ms": [40.0, 64.0] + [60.0] * 14},
               "kinds": kinds, "targets": targets(kinds)}
    text = markdown(results, "hartonomous bench --speculative --quick")
    assert "`hartonomous bench --speculative --quick`" in text and "| speculative | torch | 35.0 | 1.71x |" in text
    assert "| speculative_schedule | torch | 45.0 | 1.33x |" in text and "(40, 64, 60," in text


def test_runtime_targets_compare_the_fast_runtimes_with_llama_cpp_in_the_same_run():
    from benchmarks.speculative import MethodTotals, runtime_targets

    def kind(ms: dict, identical: dict | None = None) -> dict:
        identical = identical or {}
        rows = {m: MethodTotals(seconds=v * 64 / 1000, tokens=64, identical=identical.get(m, 1), prompts=1).row(60.0)
                for m, v in ms.items()}
        return {"methods": rows}

    results = {"short": kind({"llama_cpp": 6.5, "exact_int4": 9.1, "speculative_int4": 9.0, "exact_llama": 7.0,
                              "speculative_llama": 7.5}),
               "document": kind({"llama_cpp": 6.5, "speculative": 20.0, "speculative_int4": 5.0,
                                 "speculative_llama": 4.0}, identical={"speculative_llama": 0}),
               "repeated": kind({"llama_cpp": 6.5, "speculative_memory": 15.0, "speculative_memory_int4": 5.0,
                                 "speculative_int4": 4.0})}
    met = {t["what"]: (t["measured"], t["met"]) for t in runtime_targets(results)}
    assert met["short: exact_int4 vs llama.cpp's own decoding, ms/token"] == ("1.40x", False)
    assert met["short: exact_llama vs llama.cpp's own decoding, ms/token"] == ("1.08x", True)
    assert met["short: speculative_int4 vs exact_int4"] == ("1.01x", True)
    assert met["short: speculative_llama vs exact_llama"] == ("0.93x", False)
    # an output that is not the runtime's own greedy output never counts as the fastest
    assert met["document: fastest identical speculative (speculative_int4) vs llama.cpp's own decoding"] == ("1.30x", True)
    # repeated requests are judged with the memory on: plain speculative rows do not count there
    assert met["repeated: fastest identical speculative_memory (speculative_memory_int4) vs llama.cpp's own "
               "decoding"] == ("1.30x", True)


@pytest.mark.parametrize("a, b, same", [
    ([5, 6, 7], [5, 6, 7], True),
    ([5, 6, 0, 9], [5, 6, 8, 3], True),      # the engine emits EOS (0) where transformers, masked, went on
    ([5, 6, 0], [5, 6, 0, 1], True),
    ([5, 7, 0], [5, 6, 8], False),            # a difference before the EOS counts
    ([5, 6, 7], [5, 6, 8], False),
])
def test_greedy_outputs_are_compared_before_the_first_eos(a, b, same):
    from benchmarks.speculative import same_until_eos

    assert same_until_eos(a, b, eos=0) is same


def test_the_kernel_benchmark_measures_both_kernels_next_to_the_bare_knn(server_url):
    from benchmarks import kernel
    from native_kernel import require_native_kernel

    import psycopg
    with psycopg.connect(server_url) as conn:
        if conn.execute("SELECT ht_kernel()").fetchone()[0] != "native":
            require_native_kernel()
    r = kernel.run(server_url, sizes=(2000,), calls=20, real_sets=())
    cells = {(c["kernel"], c["context_length"], c["history"]) for c in r["rows"]}
    assert cells == {(k, n, h) for k in kernel.KERNELS for n in kernel.CONTEXT_LENGTHS for h in (True, False)}
    for c in r["rows"]:
        assert 0 < c["knn_p50_ms"] and 0 < c["next_token_p50_ms"] <= c["next_token_p95_ms"]
        assert c["overhead_p50_ms"] == c["next_token_p50_ms"] - c["knn_p50_ms"] and c["cold_first_call_ms"] > 0
        assert c["overhead_next_first_p50_ms"] is not None and c["overhead_knn_first_p50_ms"] is not None
        if c["kernel"] == "native":     # the session's counters: every history atom of a wide kernel scored
            assert c["history_scored_per_call"] == (c["context_length"] - 1 if c["history"] else 0)
            assert c["history_skipped_per_call"] == 0
        else:
            assert "history_scored_per_call" not in c
    assert {(g["kernel"], g["new_tokens"]) for g in r["generation"]} == {(k, kernel.GENERATE_TOKENS) for k in kernel.KERNELS}
    s = r["summary"]["native"][kernel.set_name(2000)]
    assert s["ratio_512_over_8"] > 0 and s["generate_tokens_per_s"] > 0
    text = kernel.markdown(r, "hartonomous bench --kernel --sizes 2000")
    assert "| bench-kernel-2000 | native | 512 | on |" in text and "generate_tokens" in text


def test_the_scaling_benchmark_counts_the_entries_a_knn_rechecks(server_url):
    """Atoms whose keys differ only beyond float4 tie in the GiST's boxes: a KNN-100 among 300 of
    them reads all 300 to order them exactly, one among well-separated atoms at most 101."""
    import psycopg

    from benchmarks.scaling import index_reads
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, drop_atom_set, write_atom_set

    grid = np.stack(np.meshgrid(*[np.arange(10.0)] * 3, indexing="ij"), -1).reshape(-1, 3)   # 1,000 atoms 1 apart
    tied = np.full((300, 3), 100.0) + np.arange(300)[:, None] * 1e-9                   # 300 within one float4
    tokens = TokenRows(np.arange(2), [None, None], np.array([[4.5, 4.5, 4.5], [100.0, 100.0, 100.0]]))
    atoms = AtomRows(np.r_[np.zeros(len(grid), int), np.ones(len(tied), int)], np.r_[grid, tied])
    with psycopg.connect(server_url, autocommit=True) as conn:
        write_atom_set(conn, AtomSetSpec("bench-recheck", "synthetic", 2, 3, "none", "context", centroid_window=1),
                       tokens, atoms, replace=True)
        spread, packed = (index_reads(conn, "bench-recheck", [[t]] * 3) for t in (0, 1))
        drop_atom_set(conn, "bench-recheck")
    assert spread["knn_index_reads_max"] <= 101 and spread["knn_reads_past_k_share"] == 0
    assert packed["knn_index_reads_p50"] >= 300 and packed["knn_reads_past_k_share"] == 1


def test_llama_cpp_joins_the_speculative_benchmark_only_where_it_is_installed(monkeypatch):
    import sys

    from benchmarks.speculative import llama_cpp_model

    monkeypatch.setitem(sys.modules, "llama_cpp", None)          # import llama_cpp raises ImportError
    assert llama_cpp_model(2) is None


def test_a_binary_copy_of_fixed_width_columns_is_read_back_without_python_per_row():
    from benchmarks.routing import parse_binary_copy
    from hartonomous.atomset.pgcopy import fixed_width_payload

    ids, xs, codes = np.array([7, -3, 49151]), np.array([0.5, -18.0, 1e-300]), np.array([0, 1, 1])
    payload = fixed_width_payload([("int4", ids), ("float8", xs), ("int2", codes)])
    rows = parse_binary_copy(payload, (("token_id", "int4"), ("x", "float8"), ("source", "int2")))
    assert rows["token_id"].tolist() == ids.tolist()
    assert rows["x"].tolist() == xs.tolist()
    assert rows["source"].tolist() == codes.tolist()
    with pytest.raises(ValueError):   # a column read with the wrong width is refused, not misread
        parse_binary_copy(payload, (("token_id", "int8"), ("x", "float8"), ("source", "int2")))


@pytest.mark.parametrize("shards", [4, 3, 64])
def test_hashes_fall_into_citus_equal_int32_ranges(shards):
    from benchmarks.routing import hash_shards

    width = 2**32 // shards
    edges = [-(2**31) + i * width for i in range(shards)]
    hashes = np.array(edges + [e + width - 1 for e in edges] + [2**31 - 1])
    expected = list(range(shards)) + list(range(shards)) + [shards - 1]
    assert hash_shards(hashes, shards).tolist() == expected


def test_the_routed_report_sets_the_cluster_against_the_single_node():
    from benchmarks.routing import markdown, summary

    def rt(side, p50, p95, routed=0, fanned=0):
        return {"measure": "next_token", "side": side, "context_tokens": 8, "p50_ms": p50, "p95_ms": p95,
                "routed": routed, "fanned_out": fanned,
                "routed_fraction": routed / (routed + fanned) if routed + fanned else None,
                "load_before": [0.5], "load_after": [0.7]}

    def clients(side, rate):
        return {"measure": "concurrency", "side": side, "context_tokens": 8, "clients": 4, "calls_per_second": rate,
                "p50_ms": 1.0, "errors": [], "load_before": [0.5], "load_after": [0.7]}

    results = {"atom_set": "lattice", "max_neighbors": 100,
               "rows": [rt("single", 2.0, 4.0), rt("cluster", 6.0, 10.0, routed=3, fanned=1),
                        clients("single", 400.0), clients("cluster", 100.0)],
               "agreement": {"next_token_8": {"compared": 4, "differ": 0}}}
    by_measure = {r["measure"]: r for r in summary(results)}
    assert by_measure["next_token"]["p50_ratio"] == 3.0 and by_measure["next_token"]["p95_ratio"] == 2.5
    assert by_measure["next_token"]["routed_fraction"] == 0.75
    assert by_measure["concurrency"]["requests_per_second_ratio"] == 0.25
    table = markdown(results)
    assert "| 8 | 2.00 | 4.00 | 6.00 | 10.00 | 3.00 | 2.50 | 75.0 % (3 / 1) | 0 of 4 |" in table
    assert "| 8 | 4 | 400.0 | 100.0 | 0.25 |" in table
