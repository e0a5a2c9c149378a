-- Frozen copies of ht_context_centroid and ht_next_token as they were before history atoms
-- (commit 4217e99), renamed to pg_temp.*_before_history. tests/test_sql_next_token.py creates
-- them in its own session and checks that next_token(..., history_weight => 0) returns exactly
-- (==, not approximately) what they give: turning history atoms off must not change one bit.
-- Do not edit: this is the old behaviour, not the current one.
CREATE FUNCTION pg_temp.ht_context_centroid_before_history(
    p_set_id integer, p_window integer, p_decay double precision, p_context integer[])
RETURNS geometry
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The centroid of an already checked context; raises 22023 for a token id not in the set.
DECLARE
    n   integer := cardinality(p_context);
    hit integer;
    sx  double precision;
    sy  double precision;
    sz  double precision;
    sw  double precision;
    bad record;
BEGIN
    SELECT count(t.token_id), sum(c.w * ST_X(t.position)), sum(c.w * ST_Y(t.position)),
           sum(c.w * ST_Z(t.position)), sum(c.w)
      INTO hit, sx, sy, sz, sw
      FROM (SELECT u.tid,
                   CASE WHEN p_window IS NOT NULL AND n - u.i >= p_window THEN 0
                        WHEN p_decay = 1 THEN 1
                        WHEN (n - u.i) * ln(p_decay) < -300 THEN 0
                        ELSE power(p_decay, (n - u.i)::double precision) END AS w
              FROM unnest(p_context) WITH ORDINALITY AS u(tid, i)) c
      LEFT JOIN tokens t ON t.atom_set_id = p_set_id AND t.token_id = c.tid;
    IF hit < n THEN
        SELECT u.i, u.tid, s.name INTO bad
          FROM unnest(p_context) WITH ORDINALITY AS u(tid, i), atom_sets s
         WHERE s.id = p_set_id
           AND NOT EXISTS (SELECT 1 FROM tokens t WHERE t.atom_set_id = p_set_id AND t.token_id = u.tid)
         ORDER BY u.i LIMIT 1;
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('context: token id %s (element %s) is not in atom set %L',
                             bad.tid, bad.i, bad.name),
            HINT = 'Tokenize with the atom set''s model (see atom_sets.model) or pick another atom_set.';
    END IF;
    RETURN ST_MakePoint(sx / sw, sy / sw, sz / sw);
END
$$;

CREATE FUNCTION pg_temp.ht_next_token_before_history(
    p_set_id integer, p_kernel text, p_bandwidth double precision, p_center geometry,
    p_context integer[], p_temperature double precision, p_top_k integer,
    p_top_p double precision, p_search_radius double precision, p_max_neighbors integer,
    p_repetition_penalty double precision)
RETURNS TABLE(token_id integer, probability double precision,
              cumulative_probability double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- Steps 3-6 of the semantics above for checked arguments and a computed centroid. Static SQL:
-- the plan is cached per session, and the atoms partition is pruned at executor start-up.
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH nearest AS (
        SELECT a.token_id AS tid, a.weight AS w, a.position <<->> p_center AS d
          FROM atoms a
         WHERE a.atom_set_id = p_set_id
         ORDER BY a.position <<->> p_center
         LIMIT p_max_neighbors
    ), contribution AS (
        SELECT n.tid,
               ln(n.w) - CASE WHEN p_kernel = 'gaussian' THEN (n.d / p_bandwidth) ^ 2
                              ELSE n.d / p_bandwidth END AS c
          FROM nearest n
         WHERE p_search_radius IS NULL OR n.d <= p_search_radius
    ), logit AS (
        SELECT g.tid,
               max(g.m) + ln(sum(CASE WHEN g.c - g.m < -744 THEN 0 ELSE exp(g.c - g.m) END)) AS x
          FROM (SELECT c.tid, c.c, max(c.c) OVER (PARTITION BY c.tid) AS m
                  FROM contribution c) g
         GROUP BY g.tid
    ), scaled AS (
        SELECT l.tid,
               CASE WHEN p_repetition_penalty <> 1 AND l.tid IN (SELECT unnest(p_context))
                    THEN CASE WHEN l.x < 0 THEN l.x * p_repetition_penalty
                              ELSE l.x / p_repetition_penalty END
                    ELSE l.x END
               / CASE WHEN p_temperature > 0 THEN p_temperature ELSE 1 END AS z
          FROM logit l
    ), top_k AS (
        SELECT r.tid, r.z, r.z - max(r.z) OVER () AS dz
          FROM (SELECT s.tid, s.z, rank() OVER (ORDER BY s.z DESC) AS k,
                       row_number() OVER (ORDER BY s.z DESC, s.tid) AS i
                  FROM scaled s) r
         WHERE (p_temperature > 0 OR r.i = 1)
           AND (p_top_k IS NULL OR p_top_k = 0 OR r.k <= p_top_k)
    ), softmax_k AS (
        SELECT e.tid, e.z, e.e / sum(e.e) OVER () AS q
          FROM (SELECT t.tid, t.z, CASE WHEN t.dz < -700 THEN 0 ELSE exp(t.dz) END AS e
                  FROM top_k t) e
    ), top_p AS (
        SELECT b.tid, b.z - max(b.z) OVER () AS dz
          FROM (SELECT s.tid, s.z,
                       coalesce(sum(s.q) OVER (ORDER BY s.z DESC, s.tid
                                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                                0) AS before
                  FROM softmax_k s) b
         WHERE p_top_p IS NULL OR p_top_p >= 1 OR b.before < p_top_p
    ), renormalised AS (
        SELECT e.tid, e.e / sum(e.e) OVER () AS p
          FROM (SELECT t.tid, CASE WHEN t.dz < -700 THEN 0 ELSE exp(t.dz) END AS e
                  FROM top_p t) e
    )
    SELECT r.tid, r.p, sum(r.p) OVER (ORDER BY r.p DESC, r.tid ROWS UNBOUNDED PRECEDING)
      FROM renormalised r
     ORDER BY r.p DESC, r.tid;
END
$$;
