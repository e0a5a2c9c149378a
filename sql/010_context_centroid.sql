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
-- history_window are the arguments when given (checked by the caller), else the set's own.
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
    history_window := coalesce(p_history_window, history_window);
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


CREATE OR REPLACE FUNCTION ht_context_centroid(
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
    RETURN ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, context);
END
$$;

COMMENT ON FUNCTION context_centroid(integer[], text) IS
    'The POINT Z the next-token KNN searches around: the windowed, decayed mean of the context tokens'' positions. See docs/sql.md.';
