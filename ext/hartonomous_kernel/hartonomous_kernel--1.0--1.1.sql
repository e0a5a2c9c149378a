-- hartonomous_kernel 1.0 -> 1.1: next_token in one call (htk_step), the step's logits and signals with the
-- session's context state (htk_step_logits) and the session's counters (htk_stats).
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE" to load this file. \quit

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
    OUT grid_steps bigint, OUT knn_boundary_ties bigint)
AS 'MODULE_PATHNAME', 'htk_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION htk_stats() IS
    'This session''s counters of the native steps: steps, context keys computed, history atoms scored and skipped by exact pruning, steps that used the grid, KNN boundary ties.';

CREATE FUNCTION htk_step_logits(
    atom_set_id integer, centroid_window integer, centroid_decay double precision,
    history_window integer, gaussian boolean, bandwidth double precision,
    history_weight double precision, context integer[], max_neighbors integer,
    search_radius double precision,
    OUT token_ids integer[], OUT logits double precision[],
    OUT h double precision, OUT h2 double precision, OUT varentropy double precision,
    OUT r double precision, OUT top_probability double precision,
    OUT nearest_bandwidths double precision, OUT history_share double precision,
    OUT distinct_tokens integer, OUT ln_top_nearest_bandwidths double precision,
    OUT ln_top_stored_votes double precision, OUT ln_top_history_nearest_bandwidths double precision)
AS 'MODULE_PATHNAME', 'htk_step_logits'
LANGUAGE C STABLE PARALLEL RESTRICTED
SET search_path = public, pg_temp
SET enable_sort = off;

COMMENT ON FUNCTION htk_step_logits(integer, integer, double precision, integer, boolean, double precision,
                                    double precision, integer[], integer, double precision) IS
    'htk_logits for a context with the session''s context state and the KNN through SPI (rows layout); NULL where ht_step_logits must take its SQL path (sql/060_kernel.sql).';
