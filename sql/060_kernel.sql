-- The native kernel: next_token's hot loop in C where the hartonomous_kernel extension is installed.
--
--   ht_kernel() RETURNS text     'native' or 'plpgsql': which implementation next_token,
--                                next_token_batch, sample_next_token, generate_tokens and
--                                draft_tokens run in this session.
--
-- 'native' when the extension hartonomous_kernel 1.5 (ext/hartonomous_kernel, built and installed by
-- `make install`; `hartonomous migrate` creates or updates it where the server has it; the version
-- whose signatures these functions call) is installed in this database and the session has not SET
-- hartonomous.kernel = 'plpgsql'. Otherwise the
-- PL/pgSQL functions of sql/010-050 run: they are the reference that defines the semantics, and the
-- native path is tested against them on the shared vectors (tests/test_kernel_native.py,
-- tests/test_kernel_pruning.py). An external server, a Docker image or Citus workers without the
-- extension run the PL/pgSQL path.
--
-- The native path splits next_token into the parts the database must do and the arithmetic:
--  0. for a set of the rows layout, the whole step in C: htk_step (next_token's own arguments; it
--     reads the atom set and returns NULL for whatever it does not serve, bad input included, so
--     next_token's checked path raises) or htk_next_token (checked arguments, from the loops).
--     The positions come from a per-session cache of the set's token_blocks (read again when the
--     set's atom_sets row is another version), the keys from a per-session state of the last
--     contexts served (only new tokens' keys are computed; both within
--     hartonomous_kernel.max_state_memory), the KNN from the index's own order through SPI (ht_knn's tie rule run
--     only at a tie across the k-th row), and the history atoms are pruned exactly: those whose
--     term cannot change a row of non-zero probability are skipped, found through a grid over
--     the keys (docs/sql.md "The native kernel" has the bound); otherwise:
--  1. positions: the context tokens' positions (ht_context_positions: ht_token_positions' read
--     of the token_blocks rows the context touches, interleaved x, y, z);
--  2. htk_keys (C): the centroid and the history keys from the positions, O(window) per key;
--  3. ht_knn_arrays (ht_knn's rows as arrays): the GiST KNN at the centroid (the index's part);
--  4. htk_distribution (C): kernel terms (history atoms pruned by the same rule, every distance
--     computed), per-token log-sum-exp, the shared sampler.
-- Every kernel runs in C, the backoff kernel included (its candidates are cut at the radius
-- ladder's rung of the nearest one, ht_backoff_radius; nothing is pruned for it). With memory
-- (the set's memory of past generations in the KNN) the KNN is ht_knn_arrays' SQL one, then step 4.
-- generate_tokens and draft_tokens check the context once per call; on the SQL path (1-4) they
-- carry its positions from step to step (one lookup per new token), and in C (0) the session's
-- state carries the keys.
-- Results agree with the PL/pgSQL path to rounding (sums may run in another order), not bit for
-- bit; rows of non-zero probability and their order are the same except where two probabilities
-- tie to rounding, and rows of probability exactly 0 may be missing after pruning.

CREATE OR REPLACE FUNCTION ht_kernel()
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- PL/pgSQL rather than SQL: its plan is cached per session (a SQL function's is not), so the
-- check costs a few microseconds per call.
BEGIN
    IF current_setting('hartonomous.kernel', true) = 'plpgsql' THEN
        RETURN 'plpgsql';
    END IF;
    RETURN CASE WHEN EXISTS (SELECT 1 FROM pg_extension e
                              WHERE e.extname = 'hartonomous_kernel' AND e.extversion = '1.5')
                THEN 'native' ELSE 'plpgsql' END;
END
$$;

COMMENT ON FUNCTION ht_kernel() IS
    'Which implementation of next_token runs in this session: native (the hartonomous_kernel C extension) or plpgsql (the reference). SET hartonomous.kernel = ''plpgsql'' forces the reference. See docs/sql.md.';


CREATE OR REPLACE FUNCTION ht_context_positions(p_set_id integer, p_context integer[],
                                                OUT xyz double precision[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The positions of an already checked context, x, y, z per element, by the reference lookup
-- (ht_token_positions, sql/012_token_positions.sql); raises 22023 for a token id not in the set,
-- with ht_context_centroid's message. The native SQL path's lookup (the one C call caches them).
DECLARE
    p      record;
    hit    integer;
BEGIN
    SELECT * INTO p FROM ht_token_positions(p_set_id, p_context);
    hit := array_position(p.xs, NULL);
    IF hit IS NOT NULL THEN
        PERFORM ht_raise_foreign_token(p_set_id, p_context, hit);
    END IF;
    xyz := ARRAY(SELECT v FROM unnest(p.xs, p.ys, p.zs) WITH ORDINALITY AS u(x, y, z, i),
                              LATERAL (VALUES (1, u.x), (2, u.y), (3, u.z)) AS c(j, v)
                  ORDER BY u.i, c.j);
END
$$;


-- ht_native_step gained p_memory; the version a database installed before is dropped.
DROP FUNCTION IF EXISTS ht_native_step(integer, integer, double precision, text, double precision, integer,
                                       double precision, integer[], double precision[], double precision,
                                       integer, double precision, double precision, integer, double precision);

CREATE OR REPLACE FUNCTION ht_native_step(
    p_set_id integer, p_centroid_window integer, p_centroid_decay double precision,
    p_kernel text, p_bandwidth double precision, p_history_window integer,
    p_history_weight double precision, p_context integer[], p_xyz double precision[],
    p_temperature double precision, p_top_k integer, p_top_p double precision,
    p_search_radius double precision, p_max_neighbors integer,
    p_repetition_penalty double precision, p_memory boolean DEFAULT false,
    OUT token_ids integer[], OUT probabilities double precision[],
    OUT cumulative double precision[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- One next_token step on the native path for checked arguments, any kernel (p_kernel: gaussian,
-- exponential or backoff). With p_xyz NULL, the whole step in C where htk_next_token serves the
-- set (the rows layout; positions from the session's cache); else, or when a context token is not
-- in the set, the context's positions (ht_context_positions, which names a foreign token) and
-- steps 2-4 at the top of this file. p_xyz, when given, is the context's positions
-- (p_xyz[3i-2 .. 3i] of p_context[i]), carried by a loop. The rows come back as three arrays in
-- next_token's order (empty: no candidates). p_memory: the KNN reads the set's memory of past
-- generations too (ht_knn's rule 4), in SQL (the whole-step C call reads the atoms only), then
-- htk_distribution.
DECLARE
    keys double precision[];
    ids  integer[];
    ws   double precision[];
    ds   double precision[];
BEGIN
    IF p_xyz IS NULL AND NOT p_memory THEN
        SELECT n.token_ids, n.probabilities, n.cumulative INTO token_ids, probabilities, cumulative
          FROM htk_next_token(p_set_id, p_centroid_window, p_centroid_decay, p_history_window,
                              p_kernel, p_bandwidth, p_history_weight, p_context,
                              p_temperature, p_top_k, p_top_p, p_search_radius, p_max_neighbors,
                              p_repetition_penalty) n;
        IF token_ids IS NOT NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_xyz IS NULL THEN
        p_xyz := ht_context_positions(p_set_id, p_context);
    END IF;
    keys := htk_keys(p_xyz, p_centroid_window, p_centroid_decay,
                     CASE WHEN p_history_weight > 0 THEN p_history_window ELSE 0 END);
    SELECT k.token_ids, k.weights, k.distances INTO ids, ws, ds
      FROM ht_knn_arrays(p_set_id, ST_MakePoint(keys[1], keys[2], keys[3]), p_max_neighbors,
                         p_search_radius, p_memory) k;
    SELECT d.token_ids, d.probabilities, d.cumulative
      INTO token_ids, probabilities, cumulative
      FROM htk_distribution(p_context, keys, ids, ws, ds, p_kernel, p_bandwidth, p_centroid_decay,
                            p_history_weight, p_temperature, p_top_k, p_top_p, p_search_radius,
                            p_repetition_penalty) d;
END
$$;


CREATE OR REPLACE FUNCTION ht_step_logits(
    context integer[],
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL)
RETURNS TABLE(token_ids integer[], logits double precision[], h double precision,
              h2 double precision, varentropy double precision, r double precision,
              top_probability double precision, nearest_bandwidths double precision,
              history_share double precision, distinct_tokens integer,
              ln_top_nearest_bandwidths double precision, ln_top_stored_votes double precision,
              ln_top_history_nearest_bandwidths double precision, risk double precision,
              predicted_gap double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
-- One step's raw token logits and its signals in one call, on the native kernel (htk_step_logits,
-- else htk_logits): the hybrid path and adaptive sampling need both per step, and apply the
-- shared sampler to the logits themselves (hartonomous/backends/spatial.py), instead of calling
-- next_token_signals and next_token, which would find the same candidates twice. logits[i] is
-- token_ids[i]'s (ascending ids; before the repetition penalty and temperature); the rest are
-- next_token_signals' columns, risk and predicted_gap included, for the same arguments. Raises
-- 0A000 on the PL/pgSQL path.
DECLARE
    s       record;
    pos     record;
    knn     record;
    v       record;
    keys    double precision[];
    v_model jsonb;
    v_signals jsonb;
BEGIN
    IF ht_kernel() <> 'native' THEN
        RAISE EXCEPTION USING ERRCODE = '0A000',
            MESSAGE = 'ht_step_logits needs the native kernel (the hartonomous_kernel extension)',
            HINT = 'Call next_token and next_token_signals instead, or install it: make install-kernel, then hartonomous migrate.';
    END IF;
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(1.0, 0, 1.0, search_radius, max_neighbors, 1.0,
                                  history_weight, history_window);
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    -- In one C call with the session's context state (the rows layout; only new tokens' keys), else
    -- (the tiles layout, a token the set lacks, which ht_context_positions names) step by step.
    SELECT * INTO v FROM htk_step_logits(s.id, s.centroid_window, s.centroid_decay, s.history_window,
                                         s.kernel, s.bandwidth, s.history_weight, context,
                                         max_neighbors, search_radius);
    IF v.token_ids IS NULL THEN
        SELECT * INTO pos FROM ht_context_positions(s.id, context);
        keys := htk_keys(pos.xyz, s.centroid_window, s.centroid_decay,
                         CASE WHEN s.history_weight > 0 THEN s.history_window ELSE 0 END);
        -- Without search_radius: the nearest stored atom is measured before it (next_token_signals).
        SELECT * INTO knn FROM ht_knn_arrays(s.id, ST_MakePoint(keys[1], keys[2], keys[3]), max_neighbors, NULL);
        SELECT * INTO v FROM htk_logits(context, keys, knn.token_ids, knn.weights, knn.distances,
                                        s.kernel, s.bandwidth, s.centroid_decay, s.history_weight, search_radius);
    END IF;
    SELECT a.risk_model INTO v_model FROM atom_sets a WHERE a.id = s.id;
    token_ids := v.token_ids;
    logits := v.logits;
    h := v.h;
    h2 := v.h2;
    varentropy := v.varentropy;
    r := v.r;
    top_probability := v.top_probability;
    nearest_bandwidths := v.nearest_bandwidths;
    history_share := v.history_share;
    distinct_tokens := v.distinct_tokens;
    ln_top_nearest_bandwidths := v.ln_top_nearest_bandwidths;
    ln_top_stored_votes := v.ln_top_stored_votes;
    ln_top_history_nearest_bandwidths := v.ln_top_history_nearest_bandwidths;
    v_signals := to_jsonb(v) - 'token_ids' - 'logits';    -- the signals by their column names
    risk := ht_risk(v_model, v_signals);
    predicted_gap := ht_linear(v_model->'gap', v_signals);
    RETURN NEXT;
END
$$;
