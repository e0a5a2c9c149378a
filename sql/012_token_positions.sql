-- The positions of a context's tokens, in one read per distinct block of token ids.
--
--   ht_token_positions(p_set_id integer, p_context integer[],
--                      OUT xs float8[], OUT ys float8[], OUT zs float8[])
--
-- xs[i], ys[i], zs[i] are the coordinates of tokens.position of the set's token p_context[i]
-- (bit for bit), or NULL when the set has no such token. They come from token_blocks, where the
-- build stores every set's positions again in rows of 256 consecutive token ids (NaN: no token;
-- hartonomous/atomset/write.py): the blocks the context touches are read once each and joined in
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
SET enable_nestloop = off
AS $$
-- enable_nestloop = off: the join of the context with its few blocks is a hash join; a nested
-- loop would probe token_blocks' index once per context element again.
BEGIN
    SELECT array_agg(CASE WHEN b.xs[(c.t & 255) + 1] <> 'NaN' THEN b.xs[(c.t & 255) + 1] END ORDER BY c.i),
           array_agg(CASE WHEN b.xs[(c.t & 255) + 1] <> 'NaN' THEN b.ys[(c.t & 255) + 1] END ORDER BY c.i),
           array_agg(CASE WHEN b.xs[(c.t & 255) + 1] <> 'NaN' THEN b.zs[(c.t & 255) + 1] END ORDER BY c.i)
      INTO xs, ys, zs
      FROM unnest(p_context) WITH ORDINALITY AS c(t, i)
      LEFT JOIN (SELECT k.block, k.xs, k.ys, k.zs
                   FROM token_blocks k
                  WHERE k.atom_set_id = p_set_id
                    AND k.block = ANY (ARRAY(SELECT DISTINCT u.t >> 8 FROM unnest(p_context) AS u(t)))) b
             ON b.block = c.t >> 8;
    IF array_position(xs, NULL) IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM token_blocks k WHERE k.atom_set_id = p_set_id) THEN
        SELECT array_agg(ST_X(t.position) ORDER BY c.i), array_agg(ST_Y(t.position) ORDER BY c.i),
               array_agg(ST_Z(t.position) ORDER BY c.i)
          INTO xs, ys, zs
          FROM unnest(p_context) WITH ORDINALITY AS c(t, i)
          LEFT JOIN tokens t ON t.atom_set_id = p_set_id AND t.token_id = c.t;
    END IF;
END
$$;
