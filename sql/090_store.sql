-- store_distribution: the atom store's own next-token distribution, with the features a gate
-- mixing it with another model's needs, for one or more prefixes of a context in one call.
--
--   store_distribution(context integer[], atom_set text = NULL, max_neighbors int = 100,
--                      history_weight float8 = NULL, history_window int = NULL,
--                      memory boolean = false, positions int = 1)
--   RETURNS TABLE(prefix_length int, token_ids int[], probabilities float8[],
--                 nearest_bandwidths float8, rung int, matched_mass float8, candidates int,
--                 top_probability float8, entropy float8, stored_share float8,
--                 history_share float8, memory_share float8)
--
-- Semantics (docs/sql.md "The store's distribution"; hartonomous/store.py store_step is the same
-- arithmetic in NumPy):
--  1. Rows: one per prefix. With n = cardinality(context) and positions = P, the rows are for the
--     prefixes context[1:L], L = n - P + 1 .. n, ascending (prefix_length = L); each row is
--     exactly what store_distribution(context[1:L], ..., positions => 1) returns. A verifier asks
--     for a draft's positions in one call; text scoring walks a document.
--  2. Candidates, per prefix: next_token's (sql/020_next_token.sql, items 1-4) for the same
--     atom_set, max_neighbors, history_weight, history_window and memory, without search_radius:
--     the max_neighbors nearest stored atoms of the set to the prefix's centroid (ht_knn's order),
--     with memory => true the nearest of the stored atoms and the set's memory of past generations
--     together (ht_knn's rule 4), plus the prefix's history atoms (weight history_weight, NULL: the
--     set's; 0 turns them off; history_window NULL: the set's). The KNN takes the max_neighbors
--     nearest stored atoms and the max_neighbors nearest memory atoms separately and keeps the
--     first max_neighbors of both by (distance, token_id, weight): rule 4's atoms, with each one's
--     source known (an exact tie of a stored and a memory atom in all three keeps the stored one).
--  3. probabilities: p_store, the kernel's own distribution before any sampler, i.e. next_token's
--     probabilities for the prefix with temperature 1, top_k 0, top_p 1, repetition_penalty 1 (the
--     same kernel, bandwidth, decay and backoff radius; per-token log-sum-exp, then the softmax).
--     token_ids ascending, probabilities[i] that of token_ids[i], summing to 1; every token with a
--     counting candidate is listed (some may have probability 0 where the softmax's cutoff, -700,
--     makes it so). Bounded: at most max_neighbors + min(history_window, L - 1) distinct tokens a
--     row (one per candidate at most). No candidate (an empty set and no history): empty arrays.
--  4. Features, over the candidates that count (every one for the gaussian and exponential kernels;
--     for the backoff kernel those within the radius R = ht_backoff_radius(D, h, decay)), with
--     c = ln(w) - (d / h)^2 | d / h | 0 each one's log contribution, M = max c and e = exp(c - M)
--     (0 where c - M < -744):
--     nearest_bandwidths  D / h, D the distance of the nearest candidate, stored, memory or
--                         history (before the backoff cut);
--     rung                backoff kernel: j = floor(ln(D / h) / ln(decay)), R = h decay^j; NULL when D
--                         counts as 0 (D <= least(h * 1e-12, 1e-14), the backoff tolerance) and for other kernels;
--     matched_mass        sum of w K(d) = exp(M + ln(sum e)) (0 where that exponent is below -744);
--     candidates          how many candidate atoms count;
--     top_probability     max(probabilities); entropy: -sum p ln p in nats (p > 0);
--     stored_share, history_share, memory_share: each source's sum of e over sum e, summing to 1.
--     No candidate: candidates 0, matched_mass 0, the other features NULL.
--  5. Bad input raises SQLSTATE 22023 naming the argument, with next_token's checks and messages
--     for the shared ones (ht_check_context, ht_check_sampler_args, ht_check_memory, ht_atom_set, a
--     token id not in the set), and positions outside 1 .. min(n, 64).
-- Implementations: the PL/pgSQL reference (ht_store_step over ht_context_centroid's keys and
-- ht_store_knn's rows) defines it. ht_kernel() = 'native' runs it in C (hartonomous_kernel 1.4):
--  - without memory, for a set of the rows layout, the whole call in one C call, htk_store_step,
--    as next_token's htk_step: the keys of the last P prefixes from the session's context state
--    (the keys of every prefix of the last contexts served, shared with next_token's C step; a
--    context that extends a kept one computes its new tokens' keys only, one that leaves it, a
--    new generation or a rejected draft's rollback, cuts the state back to the common prefix
--    first), the KNN through next_token's prepared plan, each row's arithmetic htk_store's;
--  - otherwise (memory, the tiles layout, bad input) each row's arithmetic in C (htk_store, from
--    htk_keys' keys over the positions read once) over ht_store_knn's rows.
-- Both native paths give the same rows bit for bit; they agree with the reference to rounding
-- (tests/test_store_distribution.py: 1e-12).
-- Work per call: P KNNs; keys: the tokens the kept state lacks in C (one a call for a growing
-- context), else P key computations (O(m + W) each, sql/010_context_centroid.sql).


CREATE OR REPLACE FUNCTION ht_store_knn(
    p_set_id integer, p_center geometry, p_k integer, p_memory boolean,
    OUT token_ids integer[], OUT weights double precision[], OUT distances double precision[],
    OUT memory boolean[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_sort = off
AS $$
-- ht_knn(p_set_id, p_center, p_k, NULL, p_memory)'s rows as arrays in its order, with memory[i]
-- true where row i is an atom of the set's memory (item 2 above): the p_k nearest stored atoms
-- (ht_knn_arrays) and the p_k nearest memory atoms (by the memory's GiST nd index, rule 2's order)
-- merged, the first p_k kept.
#variable_conflict use_column
DECLARE
    k record;
BEGIN
    IF ht_routes() THEN  -- a Citus coordinator: the centre's cell alone where that is the whole answer
        SELECT * INTO k FROM ht_knn_routed(p_set_id, p_center, p_k, NULL, p_memory);
        IF k.token_ids IS NOT NULL THEN
            token_ids := k.token_ids;
            weights := k.weights;
            distances := k.distances;
            memory := k.memory;
            RETURN;
        END IF;
    END IF;
    SELECT * INTO k FROM ht_knn_arrays(p_set_id, p_center, p_k, NULL, false);
    IF NOT p_memory THEN
        token_ids := k.token_ids;
        weights := k.weights;
        distances := k.distances;
        memory := array_fill(false, ARRAY[cardinality(k.token_ids)]);
        RETURN;
    END IF;
    SELECT coalesce(array_agg(u.tid ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
           coalesce(array_agg(u.w ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
           coalesce(array_agg(u.d ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
           coalesce(array_agg(u.mem ORDER BY u.d, u.tid, u.w, u.mem), '{}')
      INTO token_ids, weights, distances, memory
      FROM (SELECT u.tid, u.w, u.d, u.mem
              FROM (SELECT s.tid, s.w, s.d, false AS mem
                      FROM unnest(k.token_ids, k.weights, k.distances) AS s(tid, w, d)
                    UNION ALL
                    (SELECT n.tid, n.w, n.d, true
                       FROM (SELECT m.token_id AS tid, m.weight AS w, m.position <<->> p_center AS d
                               FROM memory_atoms m
                              WHERE m.atom_set_id = p_set_id
                              ORDER BY m.position <<->> p_center) n
                      ORDER BY n.d, n.tid, n.w
                      LIMIT p_k)) u
             ORDER BY u.d, u.tid, u.w, u.mem
             LIMIT p_k) u;
END
$$;


CREATE OR REPLACE FUNCTION ht_store_step(
    p_context integer[], p_center geometry, p_history_keys geometry[],
    p_token_ids integer[], p_weights double precision[], p_distances double precision[],
    p_memory boolean[], p_kernel text, p_bandwidth double precision, p_decay double precision,
    p_history_weight double precision,
    OUT token_ids integer[], OUT probabilities double precision[],
    OUT nearest_bandwidths double precision, OUT rung integer, OUT matched_mass double precision,
    OUT candidates integer, OUT top_probability double precision, OUT entropy double precision,
    OUT stored_share double precision, OUT history_share double precision,
    OUT memory_share double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- One row of store_distribution (items 3-4 above) for a checked prefix (1-based), its centroid, its
-- history keys (ht_context_centroid: key k of m is the atom of element n - m + k, weight
-- p_history_weight, none when that is 0) and its KNN rows (ht_store_knn). The reference htk_store
-- is tested against.
#variable_conflict use_column
DECLARE
    v_after integer := cardinality(p_context) - coalesce(cardinality(p_history_keys), 0);
BEGIN
    WITH candidate AS (
        SELECT k.tid, k.w, k.d, CASE WHEN k.mem THEN 2 ELSE 0 END AS src
          FROM unnest(p_token_ids, p_weights, p_distances, p_memory) AS k(tid, w, d, mem)
        UNION ALL
        SELECT p_context[v_after + h.k], p_history_weight, h.key <<->> p_center, 1
          FROM unnest(CASE WHEN p_history_weight > 0 THEN p_history_keys END) WITH ORDINALITY AS h(key, k)
    ), nearest AS (
        SELECT min(c.d) AS d FROM candidate c
    ), counted AS (
        SELECT c.tid, c.src,
               ln(c.w) - CASE WHEN p_kernel = 'gaussian' THEN (c.d / p_bandwidth) ^ 2
                              WHEN p_kernel = 'exponential' THEN c.d / p_bandwidth
                              ELSE 0 END AS c
          FROM candidate c
         WHERE p_kernel <> 'backoff'
            OR c.d <= (SELECT ht_backoff_radius(n.d, p_bandwidth, p_decay) FROM nearest n)
    ), top AS (
        SELECT max(c.c) AS m FROM counted c
    ), mass AS (
        SELECT count(*)::integer AS n, max(t.m) AS m, sum(e.e) AS total,
               coalesce(sum(e.e) FILTER (WHERE e.src = 0), 0) AS stored,
               coalesce(sum(e.e) FILTER (WHERE e.src = 1), 0) AS history,
               coalesce(sum(e.e) FILTER (WHERE e.src = 2), 0) AS memory
          FROM (SELECT c.src, CASE WHEN c.c - t.m < -744 THEN 0 ELSE exp(c.c - t.m) END AS e
                  FROM counted c, top t) e, top t
    ), logit AS (
        SELECT g.tid,
               max(g.m) + ln(sum(CASE WHEN g.c - g.m < -744 THEN 0 ELSE exp(g.c - g.m) END)) AS x
          FROM (SELECT c.tid, c.c, max(c.c) OVER (PARTITION BY c.tid) AS m
                  FROM counted c) g
         GROUP BY g.tid
    ), softmax AS (
        SELECT e.tid, e.e / sum(e.e) OVER () AS p
          FROM (SELECT z.tid, CASE WHEN z.dz < -700 THEN 0 ELSE exp(z.dz) END AS e
                  FROM (SELECT l.tid, l.x - max(l.x) OVER () AS dz FROM logit l) z) e
    ), dist AS (
        SELECT coalesce(array_agg(s.tid ORDER BY s.tid), '{}') AS ids,
               coalesce(array_agg(s.p ORDER BY s.tid), '{}') AS ps,
               max(s.p) AS top_p,
               0 - sum(s.p * ln(s.p)) FILTER (WHERE s.p > 0) AS h
          FROM softmax s
    )
    SELECT d.ids, d.ps, n.d / p_bandwidth,
           CASE WHEN p_kernel = 'backoff' AND n.d > least(p_bandwidth * 1e-12, 1e-14)
                THEN floor(ln(n.d / p_bandwidth) / ln(p_decay))::integer END,
           CASE WHEN m.n = 0 OR m.m + ln(m.total) < -744 THEN 0 ELSE exp(m.m + ln(m.total)) END,
           m.n, d.top_p, d.h,
           m.stored / m.total, m.history / m.total, m.memory / m.total
      INTO token_ids, probabilities, nearest_bandwidths, rung, matched_mass, candidates,
           top_probability, entropy, stored_share, history_share, memory_share
      FROM dist d, nearest n, mass m;
END
$$;


CREATE OR REPLACE FUNCTION store_distribution(
    context integer[],
    atom_set text DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL,
    memory boolean DEFAULT false,
    positions integer DEFAULT 1)
RETURNS TABLE(prefix_length integer, token_ids integer[], probabilities double precision[],
              nearest_bandwidths double precision, rung integer, matched_mass double precision,
              candidates integer, top_probability double precision, entropy double precision,
              stored_share double precision, history_share double precision,
              memory_share double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The store's distribution and its features for the last `positions` prefixes of a context;
-- semantics at the top of this file.
DECLARE
    s      record;
    c      record;
    k      record;
    r      record;
    ctx    integer[];
    n      integer;
    xyz    double precision[];
    keys   double precision[];
    native boolean := ht_kernel() = 'native';
BEGIN
    IF store_distribution.memory IS FALSE AND native THEN
        -- The whole call in C (htk_store_step) where it serves it: this function's own arguments,
        -- a set of the rows layout holding every context token. Anything else, bad input
        -- included, takes the checked path below; so does memory, as next_token's C step.
        RETURN QUERY SELECT * FROM htk_store_step(context, atom_set, max_neighbors, history_weight,
                                                  history_window, positions);
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    PERFORM ht_check_memory(store_distribution.memory, 'true reads the atom set''s memory of past generations beside its atoms; false (the default) does not.');
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(1.0, 0, 1.0, NULL, max_neighbors, 1.0, history_weight, history_window);
    ctx := context[array_lower(context, 1):array_upper(context, 1)];      -- 1-based
    n := cardinality(ctx);
    PERFORM ht_check_between('positions', positions, 1, least(n, 64),
        'It counts the prefixes answered, the longest last: 1 (the default) is the whole context alone; at most the context''s length and 64.');
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    IF native THEN
        xyz := ht_context_positions(s.id, ctx);
    END IF;
    FOR i IN n - positions + 1 .. n LOOP
        IF native THEN
            keys := htk_keys(xyz[1:3 * i], s.centroid_window, s.centroid_decay, s.history_window);
            SELECT * INTO k FROM ht_store_knn(s.id, ST_MakePoint(keys[1], keys[2], keys[3]), max_neighbors,
                                              store_distribution.memory);
            SELECT * INTO r FROM htk_store(ctx[1:i], keys, k.token_ids, k.weights, k.distances, k.memory,
                                           s.kernel, s.bandwidth, s.centroid_decay, s.history_weight);
        ELSE
            SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, ctx[1:i],
                                                     s.history_window);
            SELECT * INTO k FROM ht_store_knn(s.id, c.center, max_neighbors, store_distribution.memory);
            SELECT * INTO r FROM ht_store_step(ctx[1:i], c.center, c.history_keys, k.token_ids, k.weights,
                                               k.distances, k.memory, s.kernel, s.bandwidth, s.centroid_decay,
                                               s.history_weight);
        END IF;
        prefix_length := i;
        token_ids := r.token_ids;
        probabilities := r.probabilities;
        nearest_bandwidths := r.nearest_bandwidths;
        rung := r.rung;
        matched_mass := r.matched_mass;
        candidates := r.candidates;
        top_probability := r.top_probability;
        entropy := r.entropy;
        stored_share := r.stored_share;
        history_share := r.history_share;
        memory_share := r.memory_share;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION store_distribution(integer[], text, integer, double precision, integer, boolean, integer) IS
    'The atom store''s own next-token distribution (next_token at temperature 1 without top-k, top-p or penalty; token ids ascending) with its features (nearest distance in bandwidths, backoff rung, matched mass, candidates, top probability, entropy, stored/history/memory shares), one row per prefix for the last `positions` prefixes. See docs/sql.md.';
