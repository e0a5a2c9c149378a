-- draft_tokens: the spatial path drafts n tokens in one call, for speculative decoding.
--
--   draft_tokens(context integer[], n integer,
--                <next_token's sampler arguments: temperature, top_k, top_p, search_radius,
--                 max_neighbors, atom_set, repetition_penalty, with next_token's defaults>,
--                seed bigint = NULL, first_step integer = 0, stop_tokens integer[] = NULL,
--                history_weight float8 = NULL, history_window integer = NULL,
--                memory boolean = false)
--   RETURNS TABLE(step integer, token_id integer, token_ids integer[],
--                 probabilities double precision[])
--
-- Semantics:
--  1. Step s (0-based) asks next_token(context || drafted so far) -- called with named
--     arguments; history_weight / history_window / memory pass through (NULL: the atom set's;
--     memory => true reads the set's memory of past generations, sql/070_memory.sql) -- and
--     picks a token from its rows by the inverse CDF at u = seeded_uniform(seed, first_step + s)
--     (random() when seed is NULL), walking the rows in their order (probability descending,
--     token_id ascending): the first row whose cumulative_probability > u, else (rounding) the
--     last row with probability > 0. T = 0 gives next_token's single argmax row. This is
--     generate_tokens' rule (the same ht_pick and ht_uniform, sql/030_sampling.sql): with
--     first_step = 0 the drafted ids equal generate_tokens(context, n, ..., seed, stop_tokens).
--  2. Each step returns one row: step s, the picked token_id, and the whole distribution it was
--     picked from (token_ids and probabilities, in next_token's row order). That distribution is
--     q, the draft distribution the speculative acceptance rule min(1, p/q) and the residual
--     max(0, p - q) need; it is after the shared sampler, like next_token's.
--  3. Drafting stops after a stop token (which is returned), after n steps, or when next_token
--     has no candidates (no row for that step; a NOTICE).
--  4. Bad input raises SQLSTATE 22023 naming the argument: n outside 1..64, first_step < 0 or
--     first_step + n beyond the integer range, seed given with first_step NULL; the context and
--     the sampler arguments are checked by next_token.

-- Older signatures (before history_weight / history_window, before memory) are replaced, not
-- overloaded.
DROP FUNCTION IF EXISTS draft_tokens(integer[], integer, double precision, integer, double precision,
                                     double precision, integer, text, double precision, bigint, integer,
                                     integer[]);
DROP FUNCTION IF EXISTS draft_tokens(integer[], integer, double precision, integer, double precision,
                                     double precision, integer, text, double precision, bigint, integer,
                                     integer[], double precision, integer);

CREATE OR REPLACE FUNCTION draft_tokens(
    context integer[],
    n integer,
    temperature double precision DEFAULT 1.0,
    top_k integer DEFAULT 40,
    top_p double precision DEFAULT 0.9,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    seed bigint DEFAULT NULL,
    first_step integer DEFAULT 0,
    stop_tokens integer[] DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL,
    memory boolean DEFAULT false)
RETURNS TABLE(step integer, token_id integer, token_ids integer[],
              probabilities double precision[])
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- n draft steps in one call; one row per drafted token with the distribution it came from.
#variable_conflict use_column
DECLARE
    ctx    integer[] := draft_tokens.context;
    ids    integer[];
    probs  double precision[];
    cums   double precision[];
    picked integer;
    st     record;
    d      record;
    xyz     double precision[];
    fast    boolean;
BEGIN
    PERFORM ht_check_between('n', draft_tokens.n, 1, 64,
                             'n is the number of tokens to draft; speculative decoding drafts a few (e.g. 4).');
    PERFORM ht_check_seed_step(draft_tokens.seed, draft_tokens.first_step, 'first_step',
                               'Use 0 to draw like generate_tokens does from its first step.');
    IF draft_tokens.first_step < 0 OR draft_tokens.first_step > 2147483647 - draft_tokens.n THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('first_step must be between 0 and %s for n = %s, got %s',
                             2147483647 - draft_tokens.n, draft_tokens.n, draft_tokens.first_step),
            HINT = 'first_step numbers the seeded draws; step s draws seeded_uniform(seed, first_step + s).';
    END IF;
    PERFORM ht_check_memory(draft_tokens.memory, 'true drafts from the atom set''s memory of past generations too; false (the default) does not.');
    IF ht_kernel() = 'native' THEN
        -- The native loop (sql/060_kernel.sql): the context and the arguments are checked once,
        -- its positions carried from step to step (one lookup per drafted token).
        PERFORM ht_check_context(ctx);
        PERFORM ht_check_sampler_args(draft_tokens.temperature, draft_tokens.top_k, draft_tokens.top_p,
                                      draft_tokens.search_radius, draft_tokens.max_neighbors,
                                      draft_tokens.repetition_penalty, draft_tokens.history_weight,
                                      draft_tokens.history_window);
        SELECT * INTO st FROM ht_atom_set(draft_tokens.atom_set, draft_tokens.history_weight,
                                         draft_tokens.history_window);
        -- The whole step in C (sql/060_kernel.sql), which reads the stored atoms only; with memory
        -- the step's KNN is ht_native_step's SQL one over atoms and memory.
        fast := NOT draft_tokens.memory AND htk_serves(st.id);
        IF NOT fast THEN
            xyz := ht_context_positions(st.id, ctx);
        END IF;
        FOR i IN 0 .. draft_tokens.n - 1 LOOP
            SELECT * INTO d FROM ht_native_step(st.id, st.centroid_window, st.centroid_decay, st.kernel,
                                                st.bandwidth, st.history_window, st.history_weight, ctx,
                                                CASE WHEN fast THEN NULL ELSE xyz END, draft_tokens.temperature, draft_tokens.top_k,
                                                draft_tokens.top_p, draft_tokens.search_radius,
                                                draft_tokens.max_neighbors, draft_tokens.repetition_penalty,
                                                draft_tokens.memory);
            picked := d.token_ids[htk_pick(d.probabilities, d.cumulative,
                                           ht_uniform(draft_tokens.seed, draft_tokens.first_step + i))];
            IF picked IS NULL THEN
                RAISE NOTICE 'draft_tokens: step %: next_token has no candidates; stopping', i;
                EXIT;
            END IF;
            step := i;
            token_id := picked;
            token_ids := d.token_ids;
            probabilities := d.probabilities;
            RETURN NEXT;
            EXIT WHEN picked = ANY (draft_tokens.stop_tokens) OR i = draft_tokens.n - 1;
            ctx := ctx || picked;
            IF NOT fast THEN
                xyz := xyz || ht_context_positions(st.id, ARRAY[picked]);
            END IF;
        END LOOP;
        RETURN;
    END IF;
    FOR s IN 0 .. draft_tokens.n - 1 LOOP
        SELECT array_agg(r.token_id ORDER BY r.i), array_agg(r.probability ORDER BY r.i),
               array_agg(r.cumulative_probability ORDER BY r.i)
          INTO ids, probs, cums
          FROM next_token(context => ctx,
                          temperature => draft_tokens.temperature,
                          top_k => draft_tokens.top_k,
                          top_p => draft_tokens.top_p,
                          search_radius => draft_tokens.search_radius,
                          max_neighbors => draft_tokens.max_neighbors,
                          atom_set => draft_tokens.atom_set,
                          repetition_penalty => draft_tokens.repetition_penalty,
                          history_weight => draft_tokens.history_weight,
                          history_window => draft_tokens.history_window,
                          memory => draft_tokens.memory)
               WITH ORDINALITY AS r(token_id, probability, cumulative_probability, i);
        picked := ids[ht_pick(probs, cums, ht_uniform(draft_tokens.seed, draft_tokens.first_step + s))];
        IF picked IS NULL THEN
            RAISE NOTICE 'draft_tokens: step %: next_token has no candidates; stopping', s;
            EXIT;
        END IF;
        step := s;
        token_id := picked;
        token_ids := ids;
        probabilities := probs;
        RETURN NEXT;
        ctx := ctx || picked;
        EXIT WHEN picked = ANY (draft_tokens.stop_tokens);
    END LOOP;
END
$$;

COMMENT ON FUNCTION draft_tokens(integer[], integer, double precision, integer, double precision,
                                 double precision, integer, text, double precision, bigint, integer,
                                 integer[], double precision, integer, boolean) IS
    'Speculative decoding''s drafter: n steps of next_token(context || drafted) in one call, step s picked at seeded_uniform(seed, first_step + s); one row per token with the distribution it was drawn from. See docs/sql.md.';


-- draft_tree: a small tree of greedy drafts in one call, for speculative decoding at any temperature.
--
--   draft_tree(context integer[], depth integer, width integer,
--              search_radius float8 = NULL, max_neighbors integer = 100, atom_set text = NULL,
--              repetition_penalty float8 = 1.0, stop_tokens integer[] = NULL,
--              history_weight float8 = NULL, history_window integer = NULL, memory boolean = false)
--   RETURNS TABLE(branch integer, step integer, token_id integer)
--
-- Semantics:
--  1. The first position branches: its candidates are the first `width` rows of
--     next_token(context, temperature => 1, top_k => width, top_p => 1, <the other arguments>),
--     in next_token's row order (probability descending, token id ascending: the order of the
--     logits after the repetition penalty). Branch b (1-based) starts with candidate b.
--  2. Every branch then continues greedily: step s >= 1 is draft_tokens(context || candidate,
--     depth - 1, temperature => 0, <the same arguments>)'s step s - 1; a branch ends after a stop
--     token, after `depth` tokens, or when next_token has no candidates. So branch 1 is what
--     draft_tokens(context, depth, temperature => 0) drafts, and the others are the next-best
--     first tokens with their greedy continuations: a tree branching at its root, where a drafter
--     is most often wrong.
--  3. Rows: (branch, step, token_id), ordered by branch, then step.
--  4. Bad input raises SQLSTATE 22023 naming the argument: depth outside 1..64, width outside
--     1..16, memory NULL; the context and the other arguments are checked by next_token.
-- The branches are chosen, not sampled, whatever the generation's temperature: the tree carries no
-- draft distribution q, and none is needed. The speculative path (hartonomous/speculative/decoding.py)
-- verifies a tree by drawing each position's token from the exact model's distribution p (at T = 0
-- the argmax) and following the branch that holds the draws, so its output has the exact path's
-- distribution at any temperature (docs/design.md "Speculative decoding"). Chains drafted at T > 0
-- come from draft_tokens, whose rows carry q for the acceptance rule min(1, p/q).

CREATE OR REPLACE FUNCTION draft_tree(
    context integer[],
    depth integer,
    width integer,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    stop_tokens integer[] DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL,
    memory boolean DEFAULT false)
RETURNS TABLE(branch integer, step integer, token_id integer)
LANGUAGE plpgsql VOLATILE PARALLEL RESTRICTED SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- A tree of greedy drafts branching at the first position; semantics above.
#variable_conflict use_column
DECLARE
    first integer[];
    b     integer := 0;
    t     integer;
    d     record;
BEGIN
    PERFORM ht_check_between('depth', draft_tree.depth, 1, 64,
                             'depth is the number of tokens per branch; speculative decoding drafts a few (e.g. 4).');
    PERFORM ht_check_between('width', draft_tree.width, 1, 16,
                             'width is the number of first tokens the tree branches into (e.g. 2).');
    SELECT array_agg(n.token_id ORDER BY n.i)
      INTO first
      FROM (SELECT r.token_id, r.i
              FROM next_token(context => draft_tree.context, temperature => 1.0, top_k => draft_tree.width,
                              top_p => 1.0, search_radius => draft_tree.search_radius,
                              max_neighbors => draft_tree.max_neighbors, atom_set => draft_tree.atom_set,
                              repetition_penalty => draft_tree.repetition_penalty,
                              history_weight => draft_tree.history_weight,
                              history_window => draft_tree.history_window, memory => draft_tree.memory)
                   WITH ORDINALITY AS r(token_id, probability, cumulative_probability, i)
             ORDER BY r.i
             LIMIT draft_tree.width) n;
    FOREACH t IN ARRAY coalesce(first, '{}') LOOP
        b := b + 1;
        branch := b;
        step := 0;
        token_id := t;
        RETURN NEXT;
        CONTINUE WHEN draft_tree.depth = 1 OR t = ANY (draft_tree.stop_tokens);
        FOR d IN SELECT * FROM draft_tokens(draft_tree.context || t, draft_tree.depth - 1, temperature => 0,
                                            search_radius => draft_tree.search_radius,
                                            max_neighbors => draft_tree.max_neighbors,
                                            atom_set => draft_tree.atom_set,
                                            repetition_penalty => draft_tree.repetition_penalty,
                                            stop_tokens => draft_tree.stop_tokens,
                                            history_weight => draft_tree.history_weight,
                                            history_window => draft_tree.history_window,
                                            memory => draft_tree.memory) LOOP
            step := d.step + 1;
            token_id := d.token_id;
            RETURN NEXT;
        END LOOP;
    END LOOP;
END
$$;

COMMENT ON FUNCTION draft_tree(integer[], integer, integer, double precision, integer, text, double precision,
                               integer[], double precision, integer, boolean) IS
    'Speculative decoding''s tree drafter (any temperature; the verifier draws from the exact model): the first position branches into the width most likely tokens, each continued greedily to depth tokens; one row per (branch, step). See docs/sql.md.';
