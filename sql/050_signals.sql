-- next_token_signals: per-step signals of the spatial path, and the atom set's predicted risk.
--
--   next_token_signals(context integer[], search_radius float8 = NULL, max_neighbors int = 100,
--                      atom_set text = NULL, history_weight float8 = NULL,
--                      history_window int = NULL)
--   RETURNS TABLE(h float8, h2 float8, varentropy float8, r float8, top_probability float8,
--                 nearest_bandwidths float8, history_share float8, distinct_tokens int,
--                 ln_top_nearest_bandwidths float8, ln_top_stored_votes float8,
--                 ln_top_history_nearest_bandwidths float8, risk float8, predicted_gap float8)
--
-- One row, for the same candidates next_token scores (sql/020_next_token.sql items 1-5: the
-- centroid, the max_neighbors nearest stored atoms by ht_knn in either layout, the context's
-- history atoms, search_radius, the kernel), read from the kernel's own distribution p = softmax(token logits), i.e.
-- next_token with temperature 1 and top-k, top-p and the repetition penalty off. So the signals
-- do not depend on the sampler a caller uses. Natural logs (nats); hartonomous/signals.py is the
-- same definition in NumPy, and the comparison reports use it too:
--   h                  = -sum p ln p              Shannon entropy (tokens with p > 0)
--   h2                 = -ln sum p^2              Renyi collision entropy
--   varentropy         = sum p (ln p + h)^2       variance of -ln p under p
--   r                  = h2 - (h - varentropy/2)  what (h, varentropy) do not explain of h2
--   top_probability    = max p
--   nearest_bandwidths = distance from the centroid to the nearest stored atom / bandwidth
--                        (before search_radius: how far the stored data is, in kernel widths)
--   history_share      = the history atoms' share of the kernel mass sum w K(d) over every
--                        candidate (0 with history off)
--   distinct_tokens    = how many distinct tokens the candidates vote for (next_token's rows
--                        at temperature 1 without top-k/top-p)
-- and the support of the distribution's top token t (largest kernel mass, ties: the lowest token
-- id, i.e. greedy next_token's row), d the distance to the centroid, h the bandwidth:
--   ln_top_nearest_bandwidths         = ln(min d/h over t's candidates + 0.01)
--   ln_top_stored_votes               = ln(1 + the number of t's stored candidates)
--   ln_top_history_nearest_bandwidths = ln(least(10, min d/h over t's history candidates) + 0.01),
--                                       ln(10.01) when t has none
--   (NULL without candidates; the logs and the 0.01 keep near-zero distances on a usable scale)
--   risk               = the atom set's risk predictor (atom_sets.risk_model, fitted by the build
--                        on the calibration half; ht_risk below) applied to these signals: the
--                        predicted probability that the spatial top-1 differs from the exact
--                        model's; NULL when the set has no predictor.
--   predicted_gap      = the atom set's calibration-gap regression (risk_model->'gap'; ht_linear
--                        below) applied to the same signals: the predicted NLL - H in nats, where
--                        NLL = -ln p(text's next token), capped at ln(vocabulary size), and H the
--                        entropy above; positive: confident but wrong. NULL without that model.
-- Contributions below exp(-700) times the largest one count as 0, as in next_token's softmax
-- (PostgreSQL raises on float underflow, and exp() of less than about -708 underflows).
-- Probabilities below 1e-150 count as 0 in h, h2 and varentropy (their terms are below 1e-147,
-- and PostgreSQL raises on float underflow); they still count in distinct_tokens.
-- No candidates (search_radius excludes all): the distribution signals are NULL, distinct_tokens 0.
-- Bad input raises SQLSTATE 22023 naming the argument, with next_token's rules.

CREATE OR REPLACE FUNCTION ht_linear(p_model jsonb, p_signals jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER SET search_path = public, pg_temp AS $$
-- A linear model stored as data: z = intercept + sum_i coef_i (x_i - mean_i) / scale_i over the
-- model's feature names; hartonomous/risk.py LinearModel.linear is the same formula. NULL when
-- the model is NULL (or JSON null) or a feature is missing or NULL.
DECLARE
    z double precision;
    x double precision;
    i integer;
BEGIN
    IF p_model IS NULL OR p_signals IS NULL OR jsonb_typeof(p_model) <> 'object' THEN
        RETURN NULL;
    END IF;
    z := (p_model->>'intercept')::double precision;
    FOR i IN 0 .. jsonb_array_length(p_model->'features') - 1 LOOP
        x := (p_signals->>(p_model->'features'->>i))::double precision;
        IF x IS NULL THEN
            RETURN NULL;
        END IF;
        z := z + (p_model->'coef'->>i)::double precision
                 * (x - (p_model->'mean'->>i)::double precision)
                 / (p_model->'scale'->>i)::double precision;
    END LOOP;
    RETURN z;
END
$$;


CREATE OR REPLACE FUNCTION ht_risk(p_model jsonb, p_signals jsonb) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER SET search_path = public, pg_temp AS $$
-- Logistic regression stored as data: risk = 1 / (1 + exp(-z)) of ht_linear's z (0 below
-- z = -700, 1 above 700); hartonomous/risk.py RiskModel.predict is the same formula.
DECLARE
    z double precision := ht_linear(p_model, p_signals);
BEGIN
    IF z IS NULL THEN
        RETURN NULL;
    ELSIF z < -700 THEN
        RETURN 0;
    ELSIF z > 700 THEN
        RETURN 1;
    END IF;
    RETURN 1 / (1 + exp(-z));
END
$$;


-- next_token_signals gained columns (the top token's support, predicted_gap); CREATE OR REPLACE
-- cannot change a result type, so the version a database installed before (without them) is dropped.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE p.proname = 'next_token_signals' AND n.nspname = current_schema()
                  AND NOT 'ln_top_history_nearest_bandwidths' = ANY(p.proargnames)) THEN
        EXECUTE format('DROP FUNCTION %I.next_token_signals(integer[], double precision, integer, text, '
                       'double precision, integer)', current_schema());
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION next_token_signals(
    context integer[],
    search_radius double precision DEFAULT NULL,
    max_neighbors integer DEFAULT 100,
    atom_set text DEFAULT NULL,
    history_weight double precision DEFAULT NULL,
    history_window integer DEFAULT NULL)
RETURNS TABLE(h double precision, h2 double precision, varentropy double precision,
              r double precision, top_probability double precision,
              nearest_bandwidths double precision, history_share double precision,
              distinct_tokens integer, ln_top_nearest_bandwidths double precision,
              ln_top_stored_votes double precision, ln_top_history_nearest_bandwidths double precision,
              risk double precision, predicted_gap double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET jit = off
SET plan_cache_mode = force_generic_plan
SET search_path = public, pg_temp
AS $$
#variable_conflict use_column
-- The signals of one context; semantics at the top of this file. Planned once per session (static
-- SQL, generic plan), like next_token.
DECLARE
    v_model jsonb;
    s       record;
    c       record;
    v_after integer;
    v_ln_w  double precision;
    v       record;
    v_signals jsonb;
BEGIN
    PERFORM ht_check_context(context);
    PERFORM ht_check_sampler_args(1.0, 0, 1.0, search_radius, max_neighbors, 1.0,
                                  history_weight, history_window);
    SELECT * INTO s FROM ht_atom_set(atom_set, history_weight, history_window);
    SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, context, s.history_window);
    SELECT a.risk_model INTO v_model FROM atom_sets a WHERE a.id = s.id;
    v_after := array_upper(context, 1) - coalesce(cardinality(c.history_keys), 0);
    v_ln_w := CASE WHEN s.history_weight > 0 THEN ln(s.history_weight) END;
    WITH nearest AS (
        SELECT k.token_id AS tid, k.weight AS w, k.distance AS d
          FROM ht_knn(s.id, c.center, max_neighbors) k
    ), candidate AS (
        SELECT n.tid, false AS hist, n.d,
               ln(n.w) - CASE WHEN s.kernel = 'gaussian' THEN (n.d / s.bandwidth) ^ 2
                              WHEN s.kernel = 'exponential' THEN n.d / s.bandwidth
                              ELSE 0 END AS lc
          FROM nearest n
         WHERE search_radius IS NULL OR n.d <= search_radius
        UNION ALL
        SELECT context[v_after + k.k], true, k.key <<->> c.center,
               v_ln_w - CASE WHEN s.kernel = 'gaussian' THEN ((k.key <<->> c.center) / s.bandwidth) ^ 2
                             WHEN s.kernel = 'exponential' THEN (k.key <<->> c.center) / s.bandwidth
                             ELSE 0 END
          FROM unnest(CASE WHEN s.history_weight > 0 THEN c.history_keys END)
               WITH ORDINALITY AS k(key, k)
         WHERE search_radius IS NULL OR (k.key <<->> c.center) <= search_radius
    ), contribution AS (   -- the backoff kernel keeps the candidates inside its radius (next_token)
        SELECT a.* FROM candidate a
         WHERE s.kernel <> 'backoff'
            OR a.d <= (SELECT ht_backoff_radius(min(b.d), s.bandwidth, s.centroid_decay) FROM candidate b)
    ), scaled AS (
        SELECT t.tid, t.hist, t.d,
               CASE WHEN t.lc - t.m < -700 THEN 0 ELSE exp(t.lc - t.m) END AS e
          FROM (SELECT x.*, max(x.lc) OVER () AS m FROM contribution x) t
    ), token AS (
        SELECT t.tid, sum(t.e) AS e, min(t.d) AS d, min(t.d) FILTER (WHERE t.hist) AS d_hist,
               count(*) FILTER (WHERE NOT t.hist) AS votes
          FROM scaled t GROUP BY t.tid
    ), top AS (
        SELECT t.* FROM token t ORDER BY t.e DESC, t.tid LIMIT 1
    ), prob AS (
        SELECT t.e / sum(t.e) OVER () AS p FROM token t
    ), entropy AS (
        SELECT -sum(CASE WHEN p.p > 1e-150 THEN p.p * ln(p.p) ELSE 0 END) AS h,
               -ln(sum(CASE WHEN p.p > 1e-150 THEN p.p * p.p ELSE 0 END)) AS h2, max(p.p) AS top,
               count(*)::integer AS n
          FROM prob p
    )
    SELECT e.h, e.h2,
           (SELECT sum(CASE WHEN p.p > 1e-150 THEN p.p * (ln(p.p) + e.h) ^ 2 ELSE 0 END) FROM prob p) AS v,
           e.top, e.n,
           (SELECT sum(t.e) FILTER (WHERE t.hist) / nullif(sum(t.e), 0) FROM scaled t) AS share,
           (SELECT min(n.d) FROM nearest n) / s.bandwidth AS nearest,
           (SELECT ln(t.d / s.bandwidth + 0.01) FROM top t) AS top_nearest,
           (SELECT ln(1 + t.votes) FROM top t) AS top_votes,
           (SELECT ln(least(10, coalesce(t.d_hist / s.bandwidth, 10)) + 0.01) FROM top t) AS top_history
      INTO v
      FROM entropy e;
    h := v.h;
    h2 := v.h2;
    varentropy := v.v;
    r := v.h2 - (v.h - 0.5 * v.v);
    top_probability := v.top;
    nearest_bandwidths := v.nearest;
    history_share := coalesce(v.share, CASE WHEN v.n > 0 THEN 0 END);
    distinct_tokens := v.n;
    ln_top_nearest_bandwidths := v.top_nearest;
    ln_top_stored_votes := v.top_votes;
    ln_top_history_nearest_bandwidths := v.top_history;
    v_signals := jsonb_build_object(
        'h', h, 'h2', h2, 'varentropy', varentropy, 'r', r, 'top_probability', top_probability,
        'nearest_bandwidths', nearest_bandwidths, 'history_share', history_share,
        'distinct_tokens', distinct_tokens, 'ln_top_nearest_bandwidths', ln_top_nearest_bandwidths,
        'ln_top_stored_votes', ln_top_stored_votes,
        'ln_top_history_nearest_bandwidths', ln_top_history_nearest_bandwidths);
    risk := ht_risk(v_model, v_signals);
    predicted_gap := ht_linear(v_model->'gap', v_signals);
    RETURN NEXT;
END
$$;

COMMENT ON FUNCTION next_token_signals(integer[], double precision, integer, text,
                                       double precision, integer) IS
    'Per-step signals of the spatial path (entropy H, H2, varentropy, R, top probability, nearest stored atom in bandwidths, history share of the kernel mass, distinct tokens, the top token''s nearest candidate, stored votes and nearest history atom), the atom set''s predicted risk that the spatial top-1 differs from the exact model''s, and its predicted calibration gap NLL - H. See docs/sql.md.';
