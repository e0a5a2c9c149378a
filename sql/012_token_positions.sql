-- The positions of a context's tokens, in one read per distinct block of token ids.
--
--   ht_token_positions(p_set_id integer, p_context integer[],
--                      OUT xs float8[], OUT ys float8[], OUT zs float8[])
--
-- xs[i], ys[i], zs[i] are the coordinates of tokens.position of the set's token p_context[i]
-- (bit for bit), or NULL when the set has no such token. They come from token_blocks, where the
-- build stores every set's positions again in rows of 256 consecutive token ids (NaN: no token;
-- hartonomous/atomset/write.py): the blocks the context touches are read once each and looked up in
-- memory, instead of one primary-key probe of `tokens` per context element (a 512-token context:
-- ~1,500 buffer accesses before, one or two per distinct block now). A set written before
-- token_blocks existed has none; its positions come from `tokens` as before.

CREATE OR REPLACE FUNCTION ht_token_positions(
    p_set_id integer, p_context integer[],
    OUT xs double precision[], OUT ys double precision[], OUT zs double precision[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The blocks the context touches come in one statement, as 2-D arrays px, py, pz (one row of 256 per
-- block); slot[b + 1] is block b's row. Then each element is two subscripts: no join, no sort.
DECLARE
    blocks integer[];
    slot   integer[];
    px     double precision[];
    py     double precision[];
    pz     double precision[];
BEGIN
    SELECT array_agg(k.block ORDER BY k.block), array_agg(k.xs ORDER BY k.block),
           array_agg(k.ys ORDER BY k.block), array_agg(k.zs ORDER BY k.block)
      INTO blocks, px, py, pz
      FROM token_blocks k
     WHERE k.atom_set_id = p_set_id
       AND k.block = ANY (ARRAY(SELECT DISTINCT u.t >> 8 FROM unnest(p_context) AS u(t)));
    IF blocks IS NULL THEN
        IF NOT EXISTS (SELECT 1 FROM token_blocks k WHERE k.atom_set_id = p_set_id) THEN
            -- A set written before token_blocks existed.
            SELECT array_agg(ST_X(t.position) ORDER BY c.i), array_agg(ST_Y(t.position) ORDER BY c.i),
                   array_agg(ST_Z(t.position) ORDER BY c.i)
              INTO xs, ys, zs
              FROM unnest(p_context) WITH ORDINALITY AS c(t, i)
              LEFT JOIN tokens t ON t.atom_set_id = p_set_id AND t.token_id = c.t;
            RETURN;
        END IF;
        blocks := '{-1}';                       -- no block of the context exists: all NULL
        px := '{{NaN}}';
    END IF;
    slot := array_fill(NULL::integer, ARRAY[greatest(blocks[cardinality(blocks)], 0) + 1]);
    FOR j IN 1 .. cardinality(blocks) LOOP
        IF blocks[j] >= 0 THEN
            slot[blocks[j] + 1] := j;
        END IF;
    END LOOP;
    -- NaN marks an id the set lacks; an id outside every block subscripts out of range: NULL.
    xs := ARRAY(SELECT CASE WHEN px[slot[(t >> 8) + 1]][(t & 255) + 1] <> 'NaN'
                            THEN px[slot[(t >> 8) + 1]][(t & 255) + 1] END FROM unnest(p_context) AS t);
    ys := ARRAY(SELECT CASE WHEN px[slot[(t >> 8) + 1]][(t & 255) + 1] <> 'NaN'
                            THEN py[slot[(t >> 8) + 1]][(t & 255) + 1] END FROM unnest(p_context) AS t);
    zs := ARRAY(SELECT CASE WHEN px[slot[(t >> 8) + 1]][(t & 255) + 1] <> 'NaN'
                            THEN pz[slot[(t >> 8) + 1]][(t & 255) + 1] END FROM unnest(p_context) AS t);
END
$$;


CREATE OR REPLACE FUNCTION ht_check_known_tokens(p_set_id integer, p_ids integer[], p_argument text,
                                                 p_hint text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Raises 22023 naming p_argument and the first element of p_ids the atom set has no token for
-- (remember's `generated`, draft_sources' `tokens`; contexts are checked by ht_context_centroid).
DECLARE
    pos record;
    hit integer;
BEGIN
    SELECT * INTO pos FROM ht_token_positions(p_set_id, p_ids);
    hit := array_position(pos.xs, NULL);
    IF hit IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: token id %s (element %s) is not in atom set %L', p_argument, p_ids[hit], hit,
                             (SELECT s.name FROM atom_sets s WHERE s.id = p_set_id)),
            HINT = p_hint;
    END IF;
END
$$;
