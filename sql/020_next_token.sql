-- next_token: geometric next-token prediction, the port of sp_SpatialNextToken, plus the
-- context's own history as atoms.
--
--   next_token(context integer[], temperature float8 = 1.0, top_k int = 40, top_p float8 = 0.9,
--              search_radius float8 = NULL, max_neighbors int = 100, atom_set text = NULL,
--              repetition_penalty float8 = 1.0, history_weight float8 = NULL,
--              history_window int = NULL, memory boolean = false)
--   RETURNS TABLE(token_id int, probability float8, cumulative_probability float8)
--
-- Semantics (docs/sql.md has examples; hartonomous/sampling.py is the same sampler in torch):
--  1. Atom set: atom_set names one; NULL means the default one (atom_sets.is_default).
--  2. Centroid: c = context_centroid(context, atom_set), the decayed, windowed mean of the
--     context tokens' positions (sql/010_context_centroid.sql, hartonomous/centroid.py).
--  3. KNN: the max_neighbors stored atoms of that set nearest to c in 3D, ties in distance
--     broken by token_id, then weight: ht_knn (sql/015_knn.sql), which reads the set's storage
--     layout (atom_sets.layout: 'rows', a GiST nd index over the atoms, or 'tiles', packed atom
--     tiles); both layouts give the same atoms in the same order. memory = true: the KNN is over
--     the stored atoms and the set's memory of past generations together (sql/070_memory.sql;
--     ht_knn's rule 4); false (the default): the stored atoms alone, so the result depends on
--     the atom set and the arguments only.
--  4. History atoms: the context itself contributes atoms. With n = cardinality(context),
--     H = history_window (NULL: atom_sets.history_window) and m = min(H, n - 1), for each
--     i = n - m .. n - 1 there is an atom at context_centroid(context[1:i]) (the set's own
--     centroid window and decay: the definition the stored context atoms are keyed with), with
--     token context[i + 1] and weight history_weight (NULL: atom_sets.history_weight). So each
--     of the last H tokens of the context, except its very first token, is an atom keyed by the
--     centroid of the text before it: "what followed this situation earlier in this text".
--     history_weight = 0 or history_window = 0 turns them off, and the result is then exactly
--     (bit for bit) what next_token returned before history atoms existed.
--     max_neighbors limits the stored atoms only (the history atoms are already bounded by
--     history_window); search_radius applies to both: with it, only atoms, stored or history,
--     at distance d <= search_radius from c count. hartonomous/centroid.py history_atoms is the
--     same definition in NumPy.
--  5. Kernel: an atom of weight w at distance d contributes w * exp(-d^2 / h^2) (gaussian,
--     h = atom_sets.bandwidth; h = 1 is the original's exp(-d^2)) or w * exp(-d / h)
--     (exponential, the original's exp(-d) score), or, for the backoff kernel, w if d <= R and
--     nothing otherwise, where R = ht_backoff_radius(D, h, decay): the smallest of h, h decay,
--     h decay^2, ... (any integer power of the set's centroid decay) that holds the nearest
--     candidate, at distance D. A tolerance t = least(h * 1e-12, 1e-14) absorbs rounding: D <= t
--     counts as 0 and R is never below t (so R = t then). A history key that equals the
--     centre in exact arithmetic (a context repeating with a period that divides the window) lies
--     at 0 in C and at ~1e-17 here (keys from running sums): both are kept. On deep keys
--     (projection/lattice.py) that rung holds exactly the candidates sharing the longest suffix
--     with the context, so the kernel counts the longest match: a backoff ∞-gram. A token's logit is the log of the sum of its
--     atoms' contributions, stored and history atoms alike, computed with log-sum-exp
--     (hartonomous/kernel.py). Tokens without an atom among the candidates have probability 0
--     and are not returned.
--  6. Sampler, in Hugging Face transformers' order and rules:
--     a. repetition penalty over each distinct token id in the context: logit < 0 -> logit *
--        penalty, else logit / penalty (1 = off);
--     b. temperature: logit / T for T > 0; T = 0 is greedy: one row, the highest logit (lowest
--        token id among equals), probability 1 (transformers rejects T = 0);
--     c. top-k: keep every token whose logit is >= the k-th largest (ties at the boundary are
--        kept, as in transformers); 0 or NULL = off;
--     d. top-p: softmax over the survivors; walking them by logit descending (then token_id
--        ascending) keep a token while the probability mass before it is < p; the first token
--        is always kept; 1 or NULL = off;
--     e. renormalise: probability = softmax over what is left.
--     Temperature comes before top-k/top-p (as in transformers; llama.cpp applies it last).
--  7. Rows are ordered by probability descending, then token_id ascending;
--     cumulative_probability is the running sum in that order (the last one is 1 within 1e-9).
--     Rows of probability exactly 0 (below the softmax's cutoff, seen with top_p = 1 and no
--     top_k) may be missing on the native kernel, whose exact pruning skips the history atoms
--     that can only make such rows (sql/060_kernel.sql, docs/sql.md "The native kernel").
--  8. No candidates (search_radius excludes every atom): zero rows and a NOTICE.
--  9. Bad input raises SQLSTATE 22023 naming the argument: NULL/empty context or NULL
--     elements, a token id not in the atom set, temperature < 0/NaN/Inf, top_p outside (0, 1]
--     or NaN, top_k < 0, max_neighbors outside 1..100000, repetition_penalty <= 0/NaN/Inf,
--     search_radius < 0/NaN, history_weight < 0/NaN/Inf, history_window outside 0..4096
--     (atom_sets.history_window has the same bound), memory NULL, an unknown atom set or no
--     default one.
--     temperature (when > 0) and repetition_penalty must lie in [1e-6, 1e6], where scaling
--     logits cannot overflow float8.
-- Floating point: everything is float8; exp() of arguments below -744 counts as 0, and below
-- -700 in the two softmaxes, so that e / sum(e) cannot underflow (PostgreSQL raises on underflow).
-- History keys agree with context_centroid of each prefix to rounding (~1e-15 relative), not
-- bit for bit: they come from running sums (ht_context_centroid, sql/010_context_centroid.sql).
-- Work per call: the KNN, the lookup of the context's token positions that the centroid makes
-- anyway (it serves the history keys too), and O(m + W) rows for the keys, where W is the
-- effective centroid window (centroid_window, at most floor(300 / -ln decay) + 1 tokens since
-- older weights count as 0).
-- Plan: static SQL with plan_cache_mode = force_generic_plan, so the statement is planned once
-- per session and the executor prunes the other atom sets' partitions at start-up; this was
-- faster than per-call custom plans (~5 ms of planning) and than dynamic SQL on atoms_<id>.
--
-- next_token_batch(contexts jsonb, <the same 9 arguments>) answers many contexts in one call:
-- contexts is a JSON array of arrays of token ids, e.g. '[[1, 2, 3], [4, 5]]'; the rows are
-- next_token's rows for each context, prefixed with context_index (0-based, the JSON index).

-- History atoms added arguments at the end of these signatures; CREATE OR REPLACE cannot change a
-- signature, so the versions a database installed before are dropped (no-ops on a fresh one).
DROP FUNCTION IF EXISTS ht_check_sampler_args(double precision, integer, double precision,
                                              double precision, integer, double precision);
DROP FUNCTION IF EXISTS ht_next_token(integer, text, double precision, geometry, integer[],
                                      double precision, integer, double precision,
                                      double precision, integer, double precision);
DROP FUNCTION IF EXISTS next_token(integer[], double precision, integer, double precision,
                                   double precision, integer, text, double precision);
DROP FUNCTION IF EXISTS next_token_batch(jsonb, double precision, integer, double precision,
                                         double precision, integer, text, double precision);
-- The memory of past generations added one more (p_memory, memory).
DROP FUNCTION IF EXISTS ht_next_token(integer, text, double precision, geometry, integer[],
                                      double precision, integer, double precision,
                                      double precision, integer, double precision, geometry[],
                                      double precision);
DROP FUNCTION IF EXISTS next_token(integer[], double precision, integer, double precision,
                                   double precision, integer, text, double precision,
                                   double precision, integer);

CREATE OR REPLACE FUNCTION ht_check_sampler_args(
    p_temperature double precision, p_top_k integer, p_top_p double precision,
    p_search_radius double precision, p_max_neighbors integer,
    p_repetition_penalty double precision, p_history_weight double precision,
    p_history_window integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Raises 22023 naming the first bad argument; the messages match hartonomous/sampling.py.
BEGIN
    IF p_temperature IS NULL OR p_temperature = 'NaN' OR p_temperature < 0
       OR p_temperature = 'Infinity' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('temperature must be a finite number >= 0, got %s',
                             coalesce(p_temperature::text, 'NULL')),
            HINT = 'Use 0 for greedy decoding, 1 for the model''s distribution.';
    END IF;
    -- Outside [1e-6, 1e6] logits / T overflows or underflows float8, and PostgreSQL raises.
    IF p_temperature > 0 AND (p_temperature < 1e-6 OR p_temperature > 1e6) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('temperature must be 0 or between 1e-06 and 1e+06, got %s', p_temperature),
            HINT = 'Use 0 for greedy decoding, 1 for the model''s distribution.';
    END IF;
    IF p_top_k < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('top_k must be >= 0, got %s', p_top_k),
            HINT = 'Use 0 or NULL to turn top-k off.';
    END IF;
    IF p_top_p = 'NaN' OR p_top_p <= 0 OR p_top_p > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('top_p must be in (0, 1], got %s', p_top_p),
            HINT = 'Use 1 or NULL to turn top-p off.';
    END IF;
    IF p_search_radius = 'NaN' OR p_search_radius < 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('search_radius must be >= 0, got %s', p_search_radius),
            HINT = 'Use NULL for no radius limit.';
    END IF;
    PERFORM ht_check_between('max_neighbors', p_max_neighbors, 1, 100000, 'The default is 100.');
    IF p_repetition_penalty IS NULL OR p_repetition_penalty = 'NaN' OR p_repetition_penalty <= 0
       OR p_repetition_penalty = 'Infinity' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('repetition_penalty must be a finite number > 0, got %s',
                             coalesce(p_repetition_penalty::text, 'NULL')),
            HINT = 'Use 1 for no penalty; values above 1 discourage repeating context tokens.';
    END IF;
    IF p_repetition_penalty < 1e-6 OR p_repetition_penalty > 1e6 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('repetition_penalty must be between 1e-06 and 1e+06, got %s', p_repetition_penalty),
            HINT = 'Use 1 for no penalty; values above 1 discourage repeating context tokens.';
    END IF;
    -- NULL history arguments mean the atom set's values (atom_sets has the same bounds).
    IF p_history_weight = 'NaN' OR p_history_weight < 0 OR p_history_weight = 'Infinity' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('history_weight must be a finite number >= 0, got %s', p_history_weight),
            HINT = 'Use 0 to turn history atoms off, or NULL for the atom set''s history_weight.';
    END IF;
    IF p_history_window IS NOT NULL THEN
        PERFORM ht_check_between('history_window', p_history_window, 0, 4096,
            'It counts the context''s last tokens used as history atoms; 0 turns them off, NULL is the atom set''s history_window.');
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_backoff_radius(
    p_nearest double precision, p_bandwidth double precision, p_decay double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The backoff kernel's radius (hartonomous/kernel.py backoff_radius): the smallest of the radii
-- h, h d, h d^2, ... (any integer power of the set's decay d) that holds the nearest candidate, at
-- distance p_nearest, and never below the tolerance t = least(h * 1e-12, 1e-14); t itself when
-- p_nearest is within it (it counts as 0); NULL when there is no candidate. The cap 1e-14 keeps
-- matches the keys can tell apart distinct (hartonomous/kernel.py's docstring has the numbers).
SELECT CASE WHEN p_nearest IS NULL THEN NULL
            WHEN p_nearest <= least(p_bandwidth * 1e-12, 1e-14) THEN least(p_bandwidth * 1e-12, 1e-14)
            ELSE greatest(least(p_bandwidth * 1e-12, 1e-14),
                          p_bandwidth * power(p_decay, floor(ln(p_nearest / p_bandwidth) / ln(p_decay)))) END
$$;


CREATE OR REPLACE FUNCTION ht_next_token(
    p_set_id integer, p_kernel text, p_bandwidth double precision, p_center geometry,
    p_context integer[], p_temperature double precision, p_top_k integer,
    p_top_p double precision, p_search_radius double precision, p_max_neighbors integer,
    p_repetition_penalty double precision, p_history_keys geometry[],
    p_history_weight double precision, p_memory boolean DEFAULT false)
RETURNS TABLE(token_id integer, probability double precision,
              cumulative_probability double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- Steps 3-8 of the semantics above for checked arguments, a computed centroid and the history
-- keys (ht_context_centroid): key k of m is the atom of token element n - m + k of the context,
-- weight p_history_weight (none when it is 0 or there are no keys). Static SQL: the plan is
-- cached per session, and the atoms partition is pruned at executor start-up.
#variable_conflict use_column
DECLARE
    v_after  integer := array_upper(p_context, 1) - coalesce(cardinality(p_history_keys), 0);
    v_ln_w   double precision := CASE WHEN p_history_weight > 0 THEN ln(p_history_weight) END;
    v_decay  double precision := CASE WHEN p_kernel = 'backoff'
                                      THEN (SELECT a.centroid_decay FROM atom_sets a WHERE a.id = p_set_id) END;
BEGIN
    RETURN QUERY
    WITH nearest AS (
        SELECT k.token_id AS tid, k.weight AS w, k.distance AS d
          FROM ht_knn(p_set_id, p_center, p_max_neighbors, p_search_radius, p_memory) AS k
    ), history AS (
        SELECT p_context[v_after + h.k] AS tid, h.key <<->> p_center AS d
          FROM unnest(CASE WHEN p_history_weight > 0 THEN p_history_keys END)
               WITH ORDINALITY AS h(key, k)
    ), candidate AS (
        SELECT n.tid, ln(n.w) AS ln_w, n.d
          FROM nearest n
         WHERE p_search_radius IS NULL OR n.d <= p_search_radius
        UNION ALL
        SELECT h.tid, v_ln_w, h.d
          FROM history h
         WHERE p_search_radius IS NULL OR h.d <= p_search_radius
    ), contribution AS (
        SELECT a.tid,
               a.ln_w - CASE WHEN p_kernel = 'gaussian' THEN (a.d / p_bandwidth) ^ 2
                             WHEN p_kernel = 'exponential' THEN a.d / p_bandwidth
                             ELSE 0 END AS c
          FROM candidate a
         WHERE p_kernel <> 'backoff'
            OR a.d <= (SELECT ht_backoff_radius(min(b.d), p_bandwidth, v_decay) FROM candidate b)
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


CREATE OR REPLACE FUNCTION next_token(
    context integer[],
    temperature double precision DEFAULT 1.0,
    top_k integer DEFAULT 40,
    top_p double precision DEFAULT 0.9,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL,
    memory boolean DEFAULT false)
RETURNS TABLE(token_id integer, probability double precision,
              cumulative_probability double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- The next-token distribution of one context; semantics at the top of this file.
DECLARE
    s record;
    c record;
    d record;
BEGIN
    PERFORM ht_check_memory(next_token.memory, 'true reads the atom set''s memory of past generations beside its atoms; false (the default) does not.');
    IF ht_kernel() = 'native' AND NOT next_token.memory THEN
        -- The whole call in C (htk_step, sql/060_kernel.sql) where it serves it: arguments this
        -- function accepts, a set of the rows layout holding every context token, some candidate.
        -- Anything else, bad input included, takes the checked path below. The C step reads the
        -- stored atoms only: with memory, the checked path runs ht_native_step's SQL KNN.
        SELECT * INTO d FROM htk_step(context, temperature, top_k, top_p, search_radius, max_neighbors,
                                      atom_set, repetition_penalty, history_weight, history_window);
        IF cardinality(d.token_ids) > 0 THEN
            RETURN QUERY SELECT * FROM unnest(d.token_ids, d.probabilities, d.cumulative);
            RETURN;
        END IF;
    END IF;
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(temperature, top_k, top_p, search_radius, max_neighbors,
                                  repetition_penalty, history_weight, history_window);
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    IF ht_kernel() = 'native' THEN
        -- The same rows from the C kernel (sql/060_kernel.sql), any kernel: the whole step in C
        -- where htk_next_token serves the set, else (tiles layout, a foreign token, memory)
        -- ht_native_step.
        IF NOT next_token.memory THEN
            SELECT * INTO d FROM htk_next_token(s.id, s.centroid_window, s.centroid_decay, s.history_window,
                                                s.kernel, s.bandwidth, s.history_weight,
                                                context, temperature, top_k, top_p, search_radius,
                                                max_neighbors, repetition_penalty);
        END IF;
        IF next_token.memory THEN
            SELECT * INTO d FROM ht_native_step(s.id, s.centroid_window, s.centroid_decay, s.kernel,
                                                s.bandwidth, s.history_window, s.history_weight, context,
                                                ht_context_positions(s.id, context), temperature, top_k,
                                                top_p, search_radius, max_neighbors, repetition_penalty,
                                                true);
        ELSIF d.token_ids IS NULL THEN
            SELECT * INTO d FROM ht_native_step(s.id, s.centroid_window, s.centroid_decay, s.kernel,
                                                s.bandwidth, s.history_window, s.history_weight, context,
                                                ht_context_positions(s.id, context), temperature, top_k,
                                                top_p, search_radius, max_neighbors, repetition_penalty);
        END IF;
        RETURN QUERY SELECT * FROM unnest(d.token_ids, d.probabilities, d.cumulative);
    ELSE
        SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, context, s.history_window);
        RETURN QUERY
            SELECT * FROM ht_next_token(s.id, s.kernel, s.bandwidth, c.center, context, temperature,
                                        top_k, top_p, search_radius, max_neighbors, repetition_penalty,
                                        c.history_keys, s.history_weight, next_token.memory);
    END IF;
    IF NOT FOUND THEN
        RAISE NOTICE 'next_token: no atom of atom set % lies within search_radius % of the context centroid; no candidates',
            quote_literal(s.name), search_radius
            USING HINT = 'Increase search_radius, or pass NULL for no limit.';
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION next_token_batch(
    contexts jsonb,
    temperature double precision DEFAULT 1.0,
    top_k integer DEFAULT 40,
    top_p double precision DEFAULT 0.9,
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1.0,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL)
RETURNS TABLE(context_index integer, token_id integer, probability double precision,
              cumulative_probability double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- next_token for each context of a JSON array of arrays; every context is checked first.
DECLARE
    s       record;
    c       record;
    ctxs    integer[] := '{}';
    lens    integer[] := '{}';
    elem    jsonb;
    j       integer := 0;
    ctx     integer[];
    offs    integer := 0;
    bad     boolean;
    native  boolean := ht_kernel() = 'native';
    d       record;
BEGIN
    PERFORM ht_check_sampler_args(temperature, top_k, top_p, search_radius, max_neighbors,
                                  repetition_penalty, history_weight, history_window);
    IF contexts IS NULL OR jsonb_typeof(contexts) <> 'array' OR jsonb_array_length(contexts) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('contexts must be a non-empty JSON array of arrays of token ids, got %s',
                             coalesce(left(contexts::text, 80), 'NULL')),
            HINT = 'For example ''[[504, 3458], [314]]''::jsonb.';
    END IF;
    FOR elem IN SELECT e FROM jsonb_array_elements(contexts) AS e LOOP
        IF jsonb_typeof(elem) <> 'array' THEN
            bad := true;
        ELSE
            bad := EXISTS (
                SELECT 1 FROM jsonb_array_elements(elem) AS x
                 WHERE CASE WHEN jsonb_typeof(x) <> 'number' THEN true
                            ELSE x::numeric <> trunc(x::numeric)
                                 OR x::numeric NOT BETWEEN -2147483648 AND 2147483647 END);
        END IF;
        IF bad THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('contexts[%s] must be an array of integer token ids, got %s',
                                 j, left(elem::text, 80));
        END IF;
        ctx := ARRAY(SELECT x::integer FROM jsonb_array_elements(elem) WITH ORDINALITY AS t(x, i)
                     ORDER BY t.i);
        PERFORM ht_check_context(ctx, format('contexts[%s]', j));
        ctxs := ctxs || ctx;
        lens := lens || cardinality(ctx);
        j := j + 1;
    END LOOP;
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    FOR j IN 1 .. cardinality(lens) LOOP
        ctx := ctxs[offs + 1 : offs + lens[j]];
        offs := offs + lens[j];
        IF native THEN
            SELECT * INTO d FROM ht_native_step(s.id, s.centroid_window, s.centroid_decay, s.kernel,
                                                s.bandwidth, s.history_window, s.history_weight, ctx,
                                                NULL, temperature, top_k, top_p,
                                                search_radius, max_neighbors, repetition_penalty);
            RETURN QUERY SELECT j - 1, n.* FROM unnest(d.token_ids, d.probabilities, d.cumulative) AS n;
        ELSE
            SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, ctx, s.history_window);
            RETURN QUERY
                SELECT j - 1, n.token_id, n.probability, n.cumulative_probability
                  FROM ht_next_token(s.id, s.kernel, s.bandwidth, c.center, ctx, temperature, top_k,
                                     top_p, search_radius, max_neighbors, repetition_penalty,
                                     c.history_keys, s.history_weight) AS n;
        END IF;
        IF NOT FOUND THEN
            RAISE NOTICE 'next_token_batch: contexts[%]: no atom of atom set % lies within search_radius % of the context centroid; no candidates',
                j - 1, quote_literal(s.name), search_radius;
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION next_token(integer[], double precision, integer, double precision,
                               double precision, integer, text, double precision,
                               double precision, integer, boolean) IS
    'Next-token distribution of a context: centroid, GiST KNN (with memory => true, over the set''s memory of past generations too) plus the context''s own history atoms, kernel, then the transformers sampler rules; rows by probability desc, token_id asc. See docs/sql.md.';
COMMENT ON FUNCTION next_token_batch(jsonb, double precision, integer, double precision,
                                     double precision, integer, text, double precision,
                                     double precision, integer) IS
    'next_token for each context of a JSON array of arrays, e.g. ''[[1, 2], [3]]''; rows prefixed with the 0-based context_index. See docs/sql.md.';
