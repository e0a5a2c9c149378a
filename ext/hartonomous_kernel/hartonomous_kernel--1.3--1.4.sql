-- hartonomous_kernel 1.3 -> 1.4: htk_store, store_distribution's row for one prefix (sql/090_store.sql),
-- and htk_store_step, its whole call in C with the session's context state;
-- and the backoff kernel's tolerance (a nearest distance within min(bandwidth * 1e-12, 1e-14) counts
-- as 0, the radius is never below it), which the library applies to every signature.
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE" to load this file. \quit

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
