-- hartonomous_kernel 1.5, the kernel's one version: next_token's keys, kernel and sampler in C; sql/060_kernel.sql,
-- sql/020_next_token.sql and sql/090_store.sql call them. Every kernel (gaussian, exponential, backoff) is
-- served; the kernel is an argument by name. Every function checks its own arguments (SQLSTATE 22023 naming the
-- argument); htk_step returns NULL and htk_store_step no rows instead. docs/sql.md "The native kernel".
\echo Use "CREATE EXTENSION hartonomous_kernel" to load this file. \quit

CREATE FUNCTION htk_keys(positions double precision[], centroid_window integer,
                         centroid_decay double precision, history_window integer)
RETURNS double precision[]
AS 'MODULE_PATHNAME', 'htk_keys'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION htk_keys(double precision[], integer, double precision, integer) IS
    'The context centroid and its history keys from the context tokens'' positions (x, y, z per element): 3 * (1 + m) numbers, center first (sql/060_kernel.sql).';

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

CREATE FUNCTION htk_pick(probabilities double precision[], cumulative double precision[],
                         u double precision)
RETURNS integer
AS 'MODULE_PATHNAME', 'htk_pick'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE FUNCTION htk_serves(atom_set_id integer)
RETURNS boolean
AS 'MODULE_PATHNAME', 'htk_serves'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp;

COMMENT ON FUNCTION htk_serves(integer) IS
    'Whether htk_next_token serves the atom set (rows layout, with token_blocks); loads its positions into the session''s cache.';

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

CREATE FUNCTION htk_step(
    context integer[], temperature double precision, top_k integer, top_p double precision,
    search_radius double precision, max_neighbors integer, atom_set text,
    repetition_penalty double precision, history_weight double precision, history_window integer,
    OUT token_ids integer[], OUT probabilities double precision[], OUT cumulative double precision[])
AS 'MODULE_PATHNAME', 'htk_step'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp
SET enable_sort = off;

COMMENT ON FUNCTION htk_step(integer[], double precision, integer, double precision, double precision,
                             integer, text, double precision, double precision, integer) IS
    'next_token in one C call with next_token''s own arguments (the atom set read here); NULL for anything it does not serve (bad input, the tiles layout, a foreign token): next_token then takes its checked path (sql/020_next_token.sql).';

CREATE FUNCTION htk_stats(
    OUT steps bigint, OUT keys_computed bigint, OUT history_scored bigint, OUT history_skipped bigint,
    OUT grid_steps bigint, OUT knn_boundary_ties bigint, OUT kept_bytes bigint, OUT kept_sets integer,
    OUT kept_contexts integer, OUT evictions bigint)
AS 'MODULE_PATHNAME', 'htk_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION htk_stats() IS
    'This session''s counters of the native steps (steps, context keys computed, history atoms scored and skipped by exact pruning, steps that used the grid, KNN boundary ties) and the memory it keeps between calls (bytes, atom sets'' positions, context states; at most hartonomous_kernel.max_state_memory), with the entries dropped to stay within it.';

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

CREATE FUNCTION htk_store(
    context integer[], keys double precision[],
    knn_token_ids integer[], knn_weights double precision[], knn_distances double precision[],
    knn_memory boolean[], kernel text, bandwidth double precision, centroid_decay double precision,
    history_weight double precision,
    OUT token_ids integer[], OUT probabilities double precision[],
    OUT nearest_bandwidths double precision, OUT rung integer, OUT matched_mass double precision,
    OUT candidates integer, OUT top_probability double precision, OUT entropy double precision,
    OUT stored_share double precision, OUT history_share double precision,
    OUT memory_share double precision)
AS 'MODULE_PATHNAME', 'htk_store'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION htk_store(integer[], double precision[], integer[], double precision[],
                              double precision[], boolean[], text, double precision, double precision,
                              double precision) IS
    'store_distribution''s row for one prefix from its keys and KNN rows (knn_memory flags the memory''s atoms): the kernel''s own distribution over every candidate and its features (sql/090_store.sql).';

CREATE FUNCTION htk_store_step(
    context integer[], atom_set text, max_neighbors integer, history_weight double precision,
    history_window integer, positions integer)
RETURNS TABLE(prefix_length integer, token_ids integer[], probabilities double precision[],
              nearest_bandwidths double precision, rung integer, matched_mass double precision,
              candidates integer, top_probability double precision, entropy double precision,
              stored_share double precision, history_share double precision,
              memory_share double precision)
AS 'MODULE_PATHNAME', 'htk_store_step'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp
SET enable_sort = off;

COMMENT ON FUNCTION htk_store_step(integer[], text, integer, double precision, integer, integer) IS
    'store_distribution without memory in one C call with its own arguments (the atom set read here), the keys from the session''s context state and the KNN through SPI (rows layout); no rows for anything it does not serve (bad input, the tiles layout, a foreign token): store_distribution then takes its checked path (sql/090_store.sql).';
