-- hartonomous_kernel 1.2 -> 1.3: htk_distribution, htk_logits, htk_next_token and htk_step_logits take the
-- kernel by name (kernel text: gaussian, exponential or backoff) instead of gaussian boolean, and the
-- array ones the centroid decay (the backoff kernel's radius ladder), so every kernel runs in C.
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE" to load this file. \quit

DROP FUNCTION htk_distribution(integer[], double precision[], integer[], double precision[], double precision[], boolean, double precision, double precision, double precision, integer, double precision, double precision, double precision);
DROP FUNCTION htk_logits(integer[], double precision[], integer[], double precision[], double precision[], boolean, double precision, double precision, double precision);
DROP FUNCTION htk_next_token(integer, integer, double precision, integer, boolean, double precision, double precision, integer[], double precision, integer, double precision, double precision, integer, double precision);
DROP FUNCTION htk_step_logits(integer, integer, double precision, integer, boolean, double precision, double precision, integer[], integer, double precision);

CREATE FUNCTION htk_distribution(
    context integer[], keys double precision[],
    knn_token_ids integer[], knn_weights double precision[], knn_distances double precision[],
    kernel text, bandwidth double precision, centroid_decay double precision,
    history_weight double precision,
    temperature double precision, top_k integer, top_p double precision,
    search_radius double precision, repetition_penalty double precision,
    OUT token_ids integer[], OUT probabilities double precision[],
    OUT cumulative double precision[])
AS 'MODULE_PATHNAME', 'htk_distribution_1_3'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION htk_distribution(integer[], double precision[], integer[], double precision[],
                                     double precision[], text, double precision, double precision,
                                     double precision, double precision, integer, double precision,
                                     double precision, double precision) IS
    'next_token''s steps 3-8 for checked arguments: kernel (gaussian, exponential or backoff, whose radius ladder uses centroid_decay) over the KNN rows and the history atoms, per-token log-sum-exp, the shared sampler (sql/060_kernel.sql).';

CREATE FUNCTION htk_logits(
    context integer[], keys double precision[],
    knn_token_ids integer[], knn_weights double precision[], knn_distances double precision[],
    kernel text, bandwidth double precision, centroid_decay double precision,
    history_weight double precision, search_radius double precision,
    OUT token_ids integer[], OUT logits double precision[],
    OUT h double precision, OUT h2 double precision, OUT varentropy double precision,
    OUT r double precision, OUT top_probability double precision,
    OUT nearest_bandwidths double precision, OUT history_share double precision,
    OUT distinct_tokens integer, OUT ln_top_nearest_bandwidths double precision,
    OUT ln_top_stored_votes double precision, OUT ln_top_history_nearest_bandwidths double precision)
AS 'MODULE_PATHNAME', 'htk_logits_1_3'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION htk_logits(integer[], double precision[], integer[], double precision[],
                               double precision[], text, double precision, double precision,
                               double precision, double precision) IS
    'One step''s raw token logits (before the sampler) and next_token_signals'' signals from the same candidates, for any of the three kernels (sql/060_kernel.sql).';

CREATE FUNCTION htk_next_token(
    atom_set_id integer, centroid_window integer, centroid_decay double precision,
    history_window integer, kernel text, bandwidth double precision,
    history_weight double precision, context integer[], temperature double precision,
    top_k integer, top_p double precision, search_radius double precision, max_neighbors integer,
    repetition_penalty double precision,
    OUT token_ids integer[], OUT probabilities double precision[], OUT cumulative double precision[])
AS 'MODULE_PATHNAME', 'htk_next_token_1_3'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp
SET enable_sort = off;

COMMENT ON FUNCTION htk_next_token(integer, integer, double precision, integer, text,
                                   double precision, double precision, integer[], double precision,
                                   integer, double precision, double precision, integer,
                                   double precision) IS
    'One next_token step in C for a set''s own parameters and kernel (rows layout): cached positions, keys, the KNN through SPI, kernel and sampler; NULL where the SQL path must serve it (sql/060_kernel.sql).';

CREATE FUNCTION htk_step_logits(
    atom_set_id integer, centroid_window integer, centroid_decay double precision,
    history_window integer, kernel text, bandwidth double precision,
    history_weight double precision, context integer[], max_neighbors integer,
    search_radius double precision,
    OUT token_ids integer[], OUT logits double precision[],
    OUT h double precision, OUT h2 double precision, OUT varentropy double precision,
    OUT r double precision, OUT top_probability double precision,
    OUT nearest_bandwidths double precision, OUT history_share double precision,
    OUT distinct_tokens integer, OUT ln_top_nearest_bandwidths double precision,
    OUT ln_top_stored_votes double precision, OUT ln_top_history_nearest_bandwidths double precision)
AS 'MODULE_PATHNAME', 'htk_step_logits_1_3'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp
SET enable_sort = off;

COMMENT ON FUNCTION htk_step_logits(integer, integer, double precision, integer, text, double precision,
                                    double precision, integer[], integer, double precision) IS
    'htk_logits for a context with the session''s context state and the KNN through SPI (rows layout); NULL where ht_step_logits must take its SQL path (sql/060_kernel.sql).';
