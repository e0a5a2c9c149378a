-- hartonomous_kernel 1.2 -> 1.1 (migration 0013's downgrade): htk_stats() without the memory columns.
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE TO '1.1'" to load this file. \quit

DROP FUNCTION htk_stats();

CREATE FUNCTION htk_stats(
    OUT steps bigint, OUT keys_computed bigint, OUT history_scored bigint, OUT history_skipped bigint,
    OUT grid_steps bigint, OUT knn_boundary_ties bigint)
AS 'MODULE_PATHNAME', 'htk_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION htk_stats() IS
    'This session''s counters of the native steps: steps, context keys computed, history atoms scored and skipped by exact pruning, steps that used the grid, KNN boundary ties.';

