-- Atom set lookup, context checks and the context centroid (the port of clr_ComputeCentroid).
--
-- context_centroid(context, atom_set) is the weighted mean of the context tokens' positions:
--     c = sum_k w_k p_{n-1-k} / sum_k w_k,   w_k = decay^k for k < window, else 0,
-- where k counts steps back from the newest token (k = 0 is the last one), window and decay
-- are the atom set's centroid_window (NULL = every token, as in the original) and
-- centroid_decay (1 = uniform). hartonomous/centroid.py is the same definition in NumPy; the
-- tests compare the two. Stored context atoms are keyed with it, and so are next_token's history
-- atoms (the centroid of every prefix of the context, computed in one pass in ht_next_token).
-- decay^k below e^-300 counts as 0, so that weight * coordinate cannot underflow (PostgreSQL
-- raises on underflow); the newest token's weight is 1, so this is invisible.
--
-- ht_* functions are internal building blocks of the public functions; call the public ones.
-- Every function pins search_path and is SECURITY INVOKER. Bad input raises SQLSTATE 22023
-- (invalid_parameter_value) with a message that starts with the argument's name.

-- ht_atom_set gained the history arguments and OUT columns with history atoms; CREATE OR REPLACE
-- cannot change a signature, so the one-argument version of a database installed before is dropped.
DROP FUNCTION IF EXISTS ht_atom_set(text);

CREATE OR REPLACE FUNCTION ht_atom_set(
    p_atom_set text, p_history_weight double precision DEFAULT NULL,
    p_history_window integer DEFAULT NULL,
    OUT id integer, OUT name text, OUT centroid_window integer,
    OUT centroid_decay double precision, OUT kernel text, OUT bandwidth double precision,
    OUT history_weight double precision, OUT history_window integer)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The atom set named p_atom_set, or the default one when it is NULL; history_weight and
-- history_window are the arguments when given (checked by the caller), else the set's own, and
-- history_window is 0 when history_weight is 0: it is the number of history keys to compute.
#variable_conflict use_column
BEGIN
    IF p_atom_set IS NULL THEN
        SELECT s.id, s.name, s.centroid_window, s.centroid_decay, s.kernel, s.bandwidth,
               s.history_weight, s.history_window
          INTO id, name, centroid_window, centroid_decay, kernel, bandwidth,
               history_weight, history_window
          FROM atom_sets s WHERE s.is_default;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'atom_set: there is no default atom set',
                HINT = 'Build one with `hartonomous build`, or pass atom_set => ''<name>'' (see SELECT name FROM atom_sets).';
        END IF;
    ELSE
        SELECT s.id, s.name, s.centroid_window, s.centroid_decay, s.kernel, s.bandwidth,
               s.history_weight, s.history_window
          INTO id, name, centroid_window, centroid_decay, kernel, bandwidth,
               history_weight, history_window
          FROM atom_sets s WHERE s.name = p_atom_set;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('atom_set: no atom set named %L', p_atom_set),
                HINT = 'List them with SELECT name FROM atom_sets, or pass NULL for the default one.';
        END IF;
    END IF;
    history_weight := coalesce(p_history_weight, history_weight);
    history_window := CASE WHEN history_weight > 0 THEN coalesce(p_history_window, history_window) ELSE 0 END;
END
$$;


CREATE OR REPLACE FUNCTION ht_check_context(p_context integer[], p_argument text DEFAULT 'context')
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- A context is a non-empty one-dimensional array of token ids without NULLs.
BEGIN
    IF p_context IS NULL OR cardinality(p_context) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must be a non-empty array of token ids, got %s', p_argument,
                             coalesce(p_context::text, 'NULL')),
            HINT = 'Pass the prompt''s token ids, e.g. ARRAY[504, 3458, 314].';
    END IF;
    IF array_ndims(p_context) <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must be a one-dimensional array of token ids, got %s dimensions',
                             p_argument, array_ndims(p_context));
    END IF;
    IF array_position(p_context, NULL) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must not contain NULL (element %s is NULL)', p_argument,
                             array_position(p_context, NULL)),
            HINT = 'Remove the NULLs; every element is a token id.';
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_check_between(p_argument text, p_value bigint, p_min bigint,
                                            p_max bigint, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- A whole-number argument within [p_min, p_max]; NULL is out of range. Raises 22023 naming it.
BEGIN
    IF p_value IS NULL OR p_value < p_min OR p_value > p_max THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must be between %s and %s, got %s', p_argument, p_min, p_max,
                             coalesce(p_value::text, 'NULL')),
            HINT = p_hint;
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_check_memory(p_memory boolean, p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The memory argument of next_token, draft_tokens and draft_tree: true or false, not NULL.
BEGIN
    IF p_memory IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'memory must be true or false, got NULL',
            HINT = p_hint;
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_raise_foreign_token(p_set_id integer, p_context integer[], p_element integer)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Raises 22023 for element p_element of p_context, a token id the atom set does not hold: the one
-- message every path uses (ht_context_centroid here, ht_context_positions in sql/060_kernel.sql).
DECLARE
    v_name text := (SELECT s.name FROM atom_sets s WHERE s.id = p_set_id);
BEGIN
    RAISE EXCEPTION USING ERRCODE = '22023',
        MESSAGE = format('context: token id %s (element %s) is not in atom set %L',
                         p_context[p_element], p_element, v_name),
        HINT = 'Tokenize with the atom set''s model (see atom_sets.model) or pick another atom_set.';
END
$$;


-- ht_context_centroid gained the history keys (an argument and an OUT column); CREATE OR REPLACE
-- cannot change a signature, so the version a database installed before is dropped.
DROP FUNCTION IF EXISTS ht_context_centroid(integer, integer, double precision, integer[]);

CREATE OR REPLACE FUNCTION ht_context_centroid(
    p_set_id integer, p_window integer, p_decay double precision, p_context integer[],
    p_history_window integer DEFAULT 0,
    OUT center geometry, OUT history_keys geometry[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The centroid of an already checked context; raises 22023 for a token id not in the set.
-- With p_history_window H > 0 also the keys of next_token's history atoms: with n elements and
-- m = min(H, n - 1), history_keys[k] (k = 1..m) is the centroid of elements 1 .. n - m + k - 1,
-- i.e. of the context before element n - m + k. One lookup pass serves both.
--
-- The keys in one pass. key_i = sum_{j in (i - W, i]} g_j p_j / sum_{j in (i - W, i]} g_j with
-- g_j = decay^(i - j), where W is the effective window: p_window, and at most
-- K = floor(300 / -ln decay) + 1 (older weights are below e^-300 and count as 0, as above);
-- unbounded when both are. A common factor of the g_j cancels, so windowed sums are running sums
-- of decay^(r - j) p_j for a reference element r, minus the running sum W elements back. One r
-- for the whole context would overflow (decay^-j), so the keys are cut into blocks of K
-- consecutive i with r = the block's first i; a block's rows are its elements and the W - 1
-- before them, so |r - j| < K and every scale lies in [e^-300, e^300]. Since W <= K an element
-- is in at most two blocks: O(m + W) rows. An unbounded window means one block (n <= K), and
-- the elements before the first key's prefix end come in as one carried sum, so only the last
-- m elements' positions are kept. Windows of up to 16 tokens take their sums straight from a
-- moving frame instead (one window pass instead of two; faster for short windows). The keys
-- agree with context_centroid of each prefix to rounding (~1e-15 relative), not bit for bit.
DECLARE
    n       integer := cardinality(p_context);
    hit     integer;              -- the first element whose token the set lacks
    sx      double precision;
    sy      double precision;
    sz      double precision;
    sw      double precision;
    pos     record;               -- the context's token positions: xs, ys, zs
    v_m     integer := 0;         -- number of keys
    v_first integer := 1;         -- the first key's prefix ends at element v_first
    v_last  integer := 0;         -- the last key's at element v_last = n - 1
    v_lo    integer := 1;         -- positions are kept from element v_lo to v_last
    v_carry integer := 0;         -- elements 1 .. v_carry come in as a carried sum
    v_span  integer;              -- the effective window W; NULL: unbounded
    v_block integer := 1;         -- keys per block
    v_ln_d  double precision := 0;
    v_short boolean;              -- sum windows from a moving frame (else running sums)
    tail    geometry[];
    cx      double precision;
    cy      double precision;
    cz      double precision;
    cg      double precision;
BEGIN
    IF p_history_window > 0 AND n > 1 THEN
        v_m := least(p_history_window, n - 1);
        v_first := n - v_m;
        v_last := n - 1;
        v_ln_d := ln(p_decay);
        IF v_ln_d < 0 AND 300 / -v_ln_d < n THEN
            v_block := floor(300 / -v_ln_d)::integer + 1;
            v_span := least(coalesce(p_window, v_block), v_block);
        ELSE
            v_block := n;
            v_span := p_window;
        END IF;
        IF v_span IS NULL THEN
            v_lo := v_first;
            v_carry := v_first - 1;
        ELSE
            v_lo := greatest(1, v_first - v_span + 1);
        END IF;
    END IF;
    -- The positions in one read per block of token ids (sql/012_token_positions.sql). A token
    -- the set lacks is reported first (its NULL would also make every subscript below O(n)).
    SELECT * INTO pos FROM ht_token_positions(p_set_id, p_context);
    hit := array_position(pos.xs, NULL);
    IF hit IS NOT NULL THEN
        PERFORM ht_raise_foreign_token(p_set_id, p_context, hit);
    END IF;
    SELECT sum(c.w * c.x), sum(c.w * c.y), sum(c.w * c.z), sum(c.w),
           array_agg(ST_MakePoint(c.x, c.y, c.z) ORDER BY c.i) FILTER (WHERE c.i BETWEEN v_lo AND v_last),
           sum(c.g * c.x) FILTER (WHERE c.i <= v_carry),
           sum(c.g * c.y) FILTER (WHERE c.i <= v_carry),
           sum(c.g * c.z) FILTER (WHERE c.i <= v_carry),
           sum(c.g) FILTER (WHERE c.i <= v_carry)
      INTO sx, sy, sz, sw, tail, cx, cy, cz, cg
      FROM (SELECT u.tid, u.i, pos.xs[u.i] AS x, pos.ys[u.i] AS y, pos.zs[u.i] AS z,
                   CASE WHEN p_window IS NOT NULL AND n - u.i >= p_window THEN 0
                        WHEN p_decay = 1 THEN 1
                        WHEN (n - u.i) * ln(p_decay) < -300 THEN 0
                        ELSE power(p_decay, (n - u.i)::double precision) END AS w,
                   CASE WHEN u.i <= v_carry THEN exp((v_first - u.i) * v_ln_d) END AS g
              FROM unnest(p_context) WITH ORDINALITY AS u(tid, i)) c;
    center := ST_MakePoint(sx / sw, sy / sw, sz / sw);
    IF v_m = 0 THEN
        RETURN;
    END IF;
    -- Rows (scaled): each kept element j in its own block b, and in the next one when its window
    -- reaches it, with its scale g = decay^(r - j) for the block's reference r. Two ways to sum
    -- the windows over them; v_short picks one, and the other does not run (a one-time filter).
    -- Short or unbounded windows (framed): sums straight from the frame (PostgreSQL re-adds a
    -- moving frame row by row, so this costs W per key; an unbounded frame never moves). Long
    -- windows (running, differenced): running sums minus the running sum W elements back (O(1)
    -- per key).
    v_short := v_span IS NULL OR v_span <= 16;
    WITH element AS (
        SELECT e.k + v_lo - 1 AS j, ST_X(e.p) AS x, ST_Y(e.p) AS y, ST_Z(e.p) AS z
          FROM unnest(tail) WITH ORDINALITY AS e(p, k)
    ), member AS (
        SELECT e.j, greatest(e.j - v_first, 0) / v_block AS b, e.x, e.y, e.z
          FROM element e
        UNION ALL
        SELECT e.j, (e.j - v_first) / v_block + 1, e.x, e.y, e.z
          FROM element e
         WHERE e.j >= v_first AND (e.j - v_first) % v_block + v_span > v_block
           AND v_first + ((e.j - v_first) / v_block + 1) * v_block <= v_last
    ), scaled AS (
        SELECT m.b, m.j, m.x, m.y, m.z, exp((v_first + m.b * v_block - m.j) * v_ln_d) AS g
          FROM member m
    ), framed AS (
        SELECT g.b, g.j,
               sum(g.g * g.x) OVER w + CASE WHEN g.b = 0 THEN coalesce(cx, 0) ELSE 0 END AS sx,
               sum(g.g * g.y) OVER w + CASE WHEN g.b = 0 THEN coalesce(cy, 0) ELSE 0 END AS sy,
               sum(g.g * g.z) OVER w + CASE WHEN g.b = 0 THEN coalesce(cz, 0) ELSE 0 END AS sz,
               sum(g.g) OVER w + CASE WHEN g.b = 0 THEN coalesce(cg, 0) ELSE 0 END AS sg
          FROM scaled g
         WHERE v_short
        WINDOW w AS (PARTITION BY g.b ORDER BY g.j
                     ROWS BETWEEN coalesce(v_span - 1, n) PRECEDING AND CURRENT ROW)
    ), running AS (
        SELECT g.b, g.j, sum(g.g * g.x) OVER w AS sx, sum(g.g * g.y) OVER w AS sy,
               sum(g.g * g.z) OVER w AS sz, sum(g.g) OVER w AS sg
          FROM scaled g
         WHERE NOT v_short
        WINDOW w AS (PARTITION BY g.b ORDER BY g.j ROWS UNBOUNDED PRECEDING)
    ), differenced AS (
        SELECT r.b, r.j,
               r.sx - lag(r.sx, v_span, 0::float8) OVER w AS sx,
               r.sy - lag(r.sy, v_span, 0::float8) OVER w AS sy,
               r.sz - lag(r.sz, v_span, 0::float8) OVER w AS sz,
               r.sg - lag(r.sg, v_span, 0::float8) OVER w AS sg
          FROM running r
        WINDOW w AS (PARTITION BY r.b ORDER BY r.j)
    )
    SELECT array_agg(ST_MakePoint(k.sx / k.sg, k.sy / k.sg, k.sz / k.sg) ORDER BY k.j)
      INTO history_keys
      FROM (SELECT * FROM framed UNION ALL SELECT * FROM differenced) k
     WHERE k.j >= v_first + k.b * v_block;
END
$$;


CREATE OR REPLACE FUNCTION context_centroid(context integer[], atom_set text DEFAULT NULL)
RETURNS geometry
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The POINT Z that next_token searches around for this context (see the top of this file).
DECLARE
    s record;
BEGIN
    PERFORM ht_check_context(context);
    SELECT * INTO s FROM ht_atom_set(atom_set);
    RETURN (ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, context)).center;
END
$$;

COMMENT ON FUNCTION context_centroid(integer[], text) IS
    'The POINT Z the next-token KNN searches around: the windowed, decayed mean of the context tokens'' positions. See docs/sql.md.';
