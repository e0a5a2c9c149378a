-- Sampling in the database: seeded_uniform, sample_next_token, generate_tokens.
--
-- seeded_uniform(seed, step) is a documented hash, bit-identical to
-- hartonomous.sampling.seeded_uniform:
--     h = SHA-256(seed as 8-byte big-endian two's complement || step as 4-byte big-endian)
--     u = (first 8 bytes of h as an unsigned big-endian integer >> 11) / 2^53,  in [0, 1).
-- sample_next_token draws one token from next_token's rows by the inverse CDF: walking the
-- rows in their order (probability descending, token_id ascending), it returns the first whose
-- cumulative_probability > u (u = seeded_uniform(seed, step), or random() when seed is NULL);
-- if rounding leaves none, the last row with probability > 0 (ht_pick, the one home of this
-- rule; ht_uniform gives u). T = 0 returns the argmax row.
-- generate_tokens runs the whole autoregressive loop (the original sp_BatchInference loop):
-- step s (0-based) draws with seeded_uniform(seed, s) from next_token(context || generated), so
-- it equals calling sample_next_token(context || generated, ..., seed, s) step by step. It stops
-- after emitting a stop token (which is included), at max_new_tokens, or when no atom is
-- within search_radius (with a NOTICE); it returns the generated ids only. max_new_tokens must
-- lie in 0 .. 4096 (MAX_NEW_TOKENS, the same bound as hartonomous GenerationConfig); with 0 it
-- returns '{}' after the same checks as any other call (the context's ids included).
-- history_weight and history_window (at the end of both signatures) are next_token's: history
-- atoms from the context, which for generate_tokens includes the tokens generated so far.

-- History atoms added arguments at the end of these signatures; CREATE OR REPLACE cannot change a
-- signature, so the versions a database installed before are dropped (no-ops on a fresh one).
DROP FUNCTION IF EXISTS ht_sample(integer, text, double precision, geometry, integer[],
                                  double precision, integer, double precision, double precision,
                                  integer, double precision, double precision);
DROP FUNCTION IF EXISTS sample_next_token(integer[], double precision, integer, double precision,
                                          double precision, integer, text, double precision,
                                          bigint, integer);
DROP FUNCTION IF EXISTS generate_tokens(integer[], integer, double precision, integer,
                                        double precision, double precision, integer, text,
                                        double precision, bigint, integer[]);

CREATE OR REPLACE FUNCTION seeded_uniform(seed bigint, step integer)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
    SELECT ((('x' || encode(substr(sha256(int8send(seed) || int4send(step)), 1, 8), 'hex'))::bit(64)
             >> 11)::bigint)::double precision / 9007199254740992::double precision
$$;


CREATE OR REPLACE FUNCTION ht_uniform(p_seed bigint, p_step integer)
RETURNS double precision
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The uniform a draw uses: seeded_uniform(seed, step), or random() when seed is NULL.
BEGIN
    RETURN CASE WHEN p_seed IS NULL THEN random() ELSE seeded_uniform(p_seed, p_step) END;
END
$$;


CREATE OR REPLACE FUNCTION ht_check_seed_step(p_seed bigint, p_step integer, p_argument text,
                                              p_hint text)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- A seeded draw needs its step number: raises 22023 naming p_argument when seed is given without it.
BEGIN
    IF p_seed IS NOT NULL AND p_step IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must not be NULL when seed is given', p_argument), HINT = p_hint;
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_pick(p_probabilities double precision[],
                                   p_cumulative double precision[], p_u double precision)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The pick rule of every draw (sample_next_token, generate_tokens, draft_tokens): the 1-based
-- index of the first row, in next_token's order, whose cumulative probability is > p_u; if
-- rounding leaves none, the last row with probability > 0. NULL when there are no rows.
BEGIN
    RETURN (SELECT r.i::integer
              FROM unnest(p_probabilities, p_cumulative) WITH ORDINALITY AS r(p, cum, i)
             ORDER BY CASE WHEN r.cum > p_u THEN r.i END NULLS LAST, (r.p > 0) DESC, r.i DESC
             LIMIT 1);
END
$$;


CREATE OR REPLACE FUNCTION ht_sample(
    p_set_id integer, p_kernel text, p_bandwidth double precision, p_center geometry,
    p_context integer[], p_temperature double precision, p_top_k integer,
    p_top_p double precision, p_search_radius double precision, p_max_neighbors integer,
    p_repetition_penalty double precision, p_history_keys geometry[],
    p_history_weight double precision, p_u double precision)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- ht_pick over ht_next_token's rows for a uniform p_u; NULL when no candidates.
DECLARE
    ids   integer[];
    probs double precision[];
    cums  double precision[];
BEGIN
    SELECT array_agg(n.tid ORDER BY n.i), array_agg(n.p ORDER BY n.i), array_agg(n.cum ORDER BY n.i)
      INTO ids, probs, cums
      FROM ht_next_token(p_set_id, p_kernel, p_bandwidth, p_center, p_context, p_temperature,
                         p_top_k, p_top_p, p_search_radius, p_max_neighbors,
                         p_repetition_penalty, p_history_keys,
                         p_history_weight) WITH ORDINALITY AS n(tid, p, cum, i);
    RETURN ids[ht_pick(probs, cums, p_u)];
END
$$;


CREATE OR REPLACE FUNCTION sample_next_token(
    context integer[],
    temperature double precision DEFAULT 1.0,
    top_k integer DEFAULT 40,
    top_p double precision DEFAULT 0.9,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    seed bigint DEFAULT NULL,
    step integer DEFAULT 0,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- One token drawn from next_token's distribution; deterministic for a given (seed, step).
DECLARE
    s      record;
    c      record;
    d      record;
    picked integer;
BEGIN
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(temperature, top_k, top_p, search_radius, max_neighbors,
                                  repetition_penalty, history_weight, history_window);
    PERFORM ht_check_seed_step(seed, step, 'step', 'Use 0 for the first draw of a seed, 1 for the next, ...');
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    IF ht_kernel() = 'native' THEN
        SELECT * INTO d FROM ht_native_step(s.id, s.centroid_window, s.centroid_decay, s.kernel,
                                            s.bandwidth, s.history_window, s.history_weight, context,
                                            NULL, temperature, top_k, top_p,
                                            search_radius, max_neighbors, repetition_penalty);
        picked := d.token_ids[htk_pick(d.probabilities, d.cumulative, ht_uniform(seed, step))];
    ELSE
        SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, context, s.history_window);
        picked := ht_sample(s.id, s.kernel, s.bandwidth, c.center, context, temperature, top_k, top_p,
                            search_radius, max_neighbors, repetition_penalty, c.history_keys,
                            s.history_weight, ht_uniform(seed, step));
    END IF;
    IF picked IS NULL THEN
        RAISE NOTICE 'sample_next_token: no atom of atom set % lies within search_radius % of the context centroid; returning NULL',
            quote_literal(s.name), search_radius
            USING HINT = 'Increase search_radius, or pass NULL for no limit.';
    END IF;
    RETURN picked;
END
$$;


CREATE OR REPLACE FUNCTION generate_tokens(
    context integer[],
    max_new_tokens integer,
    temperature double precision DEFAULT 1.0,
    top_k integer DEFAULT 40,
    top_p double precision DEFAULT 0.9,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    seed bigint DEFAULT NULL,
    stop_tokens integer[] DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL)
RETURNS integer[]
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The autoregressive loop in one call; returns the generated token ids (not the prompt).
DECLARE
    s         record;
    ctx       integer[] := context;
    generated integer[] := '{}';
    picked    integer;
    n         integer;
    keys      integer;
    keep      integer;
    c         record;
    d         record;
    xyz        double precision[];
    fast       boolean;
BEGIN
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(temperature, top_k, top_p, search_radius, max_neighbors,
                                  repetition_penalty, history_weight, history_window);
    PERFORM ht_check_between('max_new_tokens', max_new_tokens, 0, 4096,
                             'Generate at most 4096 tokens per call; continue from the result for more.');
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    IF ht_kernel() = 'native' THEN
        -- The native loop (sql/060_kernel.sql): each step whole in C where htk_next_token serves
        -- the set (its positions cached for the session); else the context's positions are
        -- looked up and checked once and carried from step to step (one lookup per new token).
        fast := htk_serves(s.id);
        IF NOT fast OR max_new_tokens = 0 THEN
            xyz := ht_context_positions(s.id, ctx);      -- checks every id (22023 naming a foreign one)
        END IF;
        FOR step IN 0 .. max_new_tokens - 1 LOOP
            SELECT * INTO d FROM ht_native_step(s.id, s.centroid_window, s.centroid_decay, s.kernel,
                                                s.bandwidth, s.history_window, s.history_weight, ctx,
                                                CASE WHEN fast THEN NULL ELSE xyz END, temperature, top_k, top_p,
                                                search_radius, max_neighbors, repetition_penalty);
            picked := d.token_ids[htk_pick(d.probabilities, d.cumulative, ht_uniform(seed, step))];
            IF picked IS NULL THEN
                RAISE NOTICE 'generate_tokens: step %: no atom of atom set % lies within search_radius % of the context centroid; stopping',
                    step, quote_literal(s.name), search_radius;
                EXIT;
            END IF;
            generated := generated || picked;
            EXIT WHEN picked = ANY (stop_tokens) OR step = max_new_tokens - 1;
            ctx := ctx || picked;
            IF NOT fast THEN
                xyz := xyz || ht_context_positions(s.id, ARRAY[picked]);
            END IF;
        END LOOP;
        RETURN generated;
    END IF;
    IF max_new_tokens = 0 THEN
        -- No step runs, but a context the set cannot read is still bad input: check its ids as
        -- step 0 would (22023 naming the first foreign element).
        PERFORM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, ctx);
    END IF;
    FOR step IN 0 .. max_new_tokens - 1 LOOP
        -- Step 0 checks every prompt token. Later steps read only what the centroid and the
        -- history keys need: the last keys + W tokens (W = centroid_window; NULL: all of them),
        -- since every key's prefix window then lies inside that slice.
        n := cardinality(ctx);
        keys := least(s.history_window, n - 1);
        keep := keys + s.centroid_window;
        SELECT * INTO c FROM ht_context_centroid(
            s.id, s.centroid_window, s.centroid_decay,
            CASE WHEN step = 0 OR keep IS NULL OR keep >= n THEN ctx
                 ELSE ctx[array_upper(ctx, 1) - keep + 1 : array_upper(ctx, 1)] END,
            keys);
        picked := ht_sample(s.id, s.kernel, s.bandwidth, c.center, ctx, temperature, top_k, top_p,
                            search_radius, max_neighbors, repetition_penalty, c.history_keys,
                            s.history_weight, ht_uniform(seed, step));
        IF picked IS NULL THEN
            RAISE NOTICE 'generate_tokens: step %: no atom of atom set % lies within search_radius % of the context centroid; stopping',
                step, quote_literal(s.name), search_radius;
            EXIT;
        END IF;
        generated := generated || picked;
        ctx := ctx || picked;
        EXIT WHEN picked = ANY (stop_tokens);
    END LOOP;
    RETURN generated;
END
$$;

COMMENT ON FUNCTION seeded_uniform(bigint, integer) IS
    'u in [0, 1): (first 8 bytes of SHA-256(seed int8 BE || step int4 BE) >> 11) / 2^53; bit-identical to hartonomous.sampling.seeded_uniform.';
COMMENT ON FUNCTION sample_next_token(integer[], double precision, integer, double precision,
                                      double precision, integer, text, double precision, bigint, integer,
                                      double precision, integer) IS
    'One token drawn from next_token''s rows by the inverse CDF at seeded_uniform(seed, step) (random() when seed is NULL). See docs/sql.md.';
COMMENT ON FUNCTION generate_tokens(integer[], integer, double precision, integer, double precision,
                                    double precision, integer, text, double precision, bigint, integer[],
                                    double precision, integer) IS
    'The whole autoregressive loop: step s samples next_token(context || generated) at seeded_uniform(seed, s); returns the generated ids. See docs/sql.md.';
