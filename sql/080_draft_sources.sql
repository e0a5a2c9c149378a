-- draft_sources: where each drafted token came from, for the playground's colours (issue 25).
--
--   draft_sources(context integer[], tokens integer[],
--                 search_radius float8 = NULL, max_neighbors integer = 100, atom_set text = NULL,
--                 history_weight float8 = NULL, history_window integer = NULL,
--                 memory boolean = false)
--   RETURNS TABLE(step integer, token_id integer, source text, weight double precision,
--                 distance double precision)
--
-- Semantics:
--  1. Step s (0-based) looks at the candidates next_token(context || tokens[1..s], ...) scores
--     with the same search_radius, max_neighbors, atom_set, history_weight, history_window and
--     memory (sql/020_next_token.sql items 2-4: the max_neighbors stored atoms nearest to the
--     context centroid, with the set's memory when memory => true (ht_knn rule 4), then the
--     history atoms, then the search_radius cut), and among those that vote for tokens[s + 1]
--     takes the one with the largest kernel term: ln w - (d / h)^2 (gaussian), ln w - d / h
--     (exponential), ln w inside the backoff radius (backoff; atoms outside it do not vote).
--  2. Its source: the stored atom's (ht_atom_source: 'corpus' or 'self-distilled', the code in
--     atoms.source), 'memory' for an atom of the set's memory of past generations, 'context' for
--     a history atom (the context's own earlier text). Its weight and distance come with it.
--     Ties in the kernel term go to the nearer atom, then to the order corpus, self-distilled,
--     memory, context.
--  3. One row per step; source, weight and distance are NULL when no candidate votes for the
--     token (a token the drafter did not propose).
--  4. Bad input raises SQLSTATE 22023 naming the argument: context and tokens as next_token's
--     context (non-empty, no NULLs, ids the set holds), at most 64 tokens, and next_token's
--     checks of the other arguments.
-- The stored atoms are read from the set's atoms partition, ordered by (distance, token_id,
-- weight) as ht_knn orders them in either layout, so the candidates are next_token's.

CREATE OR REPLACE FUNCTION ht_atom_source(p_code smallint)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The name of an atoms.source code (migration 0012; hartonomous.atomset.write.ATOM_SOURCES).
SELECT CASE p_code WHEN 0 THEN 'corpus' WHEN 1 THEN 'self-distilled' END
$$;


CREATE OR REPLACE FUNCTION draft_sources(
    context integer[],
    tokens integer[],
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL,
    memory boolean DEFAULT false)
RETURNS TABLE(step integer, token_id integer, source text, weight double precision,
              distance double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The source of the atom that voted most for each drafted token; semantics above.
#variable_conflict use_column
DECLARE
    s       record;
    c       record;
    ctx     integer[];
    v_after integer;
    v_ln_w  double precision;
    v_tid   integer;
BEGIN
    PERFORM ht_check_context(draft_sources.context);
    PERFORM ht_check_context(draft_sources.tokens, 'tokens');
    PERFORM ht_check_between('tokens', cardinality(draft_sources.tokens), 1, 64,
                             'tokens are the drafted tokens whose sources are asked for (a round''s, a few).');
    PERFORM ht_check_sampler_args(1.0, 40, 0.9, draft_sources.search_radius, draft_sources.max_neighbors,
                                  1.0, draft_sources.history_weight, draft_sources.history_window);
    PERFORM ht_check_memory(draft_sources.memory, 'true reads the atom set''s memory of past generations beside its atoms; false (the default) does not.');
    SELECT * INTO s FROM ht_atom_set(draft_sources.atom_set, draft_sources.history_weight,
                                     draft_sources.history_window);
    PERFORM ht_check_known_tokens(s.id, draft_sources.tokens, 'tokens',
                                  'Pass the token ids the atom set drafted (draft_tokens).');
    v_ln_w := CASE WHEN s.history_weight > 0 THEN ln(s.history_weight) END;
    FOR i IN 1 .. cardinality(draft_sources.tokens) LOOP
        ctx := draft_sources.context || draft_sources.tokens[1:i - 1];
        v_tid := draft_sources.tokens[i];
        SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, ctx, s.history_window);
        v_after := cardinality(ctx) - coalesce(cardinality(c.history_keys), 0);
        step := i - 1;
        token_id := v_tid;
        source := NULL; weight := NULL; distance := NULL;
        SELECT b.src, b.w, b.d INTO source, weight, distance
          FROM (
            WITH stored AS (
                SELECT a.token_id AS tid, a.weight AS w, a.position <<->> c.center AS d,
                       ht_atom_source(a.source) AS src, a.source::integer AS rank
                  FROM atoms a
                 WHERE a.atom_set_id = s.id
                 ORDER BY a.position <<->> c.center, a.token_id, a.weight, a.source
                 LIMIT draft_sources.max_neighbors
            ), remembered AS (
                SELECT m.token_id AS tid, m.weight AS w, m.position <<->> c.center AS d,
                       'memory'::text AS src, 2 AS rank
                  FROM memory_atoms m
                 WHERE draft_sources.memory AND m.atom_set_id = s.id
                 ORDER BY m.position <<->> c.center, m.token_id, m.weight
                 LIMIT draft_sources.max_neighbors
            ), nearest AS (
                SELECT * FROM (SELECT * FROM stored UNION ALL SELECT * FROM remembered) u
                 ORDER BY u.d, u.tid, u.w, u.rank
                 LIMIT draft_sources.max_neighbors
            ), candidate AS (
                SELECT n.tid, ln(n.w) AS ln_w, n.w, n.d, n.src, n.rank
                  FROM nearest n
                 WHERE draft_sources.search_radius IS NULL OR n.d <= draft_sources.search_radius
                UNION ALL
                SELECT ctx[v_after + h.k], v_ln_w, s.history_weight, h.key <<->> c.center, 'context', 3
                  FROM unnest(CASE WHEN s.history_weight > 0 THEN c.history_keys END) WITH ORDINALITY AS h(key, k)
                 WHERE draft_sources.search_radius IS NULL OR h.key <<->> c.center <= draft_sources.search_radius
            )
            SELECT a.src, a.w, a.d,
                   a.ln_w - CASE WHEN s.kernel = 'gaussian' THEN (a.d / s.bandwidth) ^ 2
                                 WHEN s.kernel = 'exponential' THEN a.d / s.bandwidth
                                 ELSE 0 END AS term, a.rank
              FROM candidate a
             WHERE a.tid = v_tid
               AND (s.kernel <> 'backoff'
                    OR a.d <= (SELECT ht_backoff_radius(min(x.d), s.bandwidth, s.centroid_decay) FROM candidate x))
          ) b
         ORDER BY b.term DESC, b.d, b.rank
         LIMIT 1;
        RETURN NEXT;
    END LOOP;
END
$$;

COMMENT ON FUNCTION draft_sources(integer[], integer[], double precision, integer, text, double precision, integer,
                                  boolean) IS
    'Where each drafted token came from: the source (corpus, self-distilled, memory, context) of the candidate atom with the largest kernel term for it, as next_token scores it; one row per token. See docs/sql.md.';
