-- hartonomous_kernel 1.1 -> 1.2: htk_stats() also reports the memory the session keeps between calls
-- (bounded by hartonomous_kernel.max_state_memory). The library of 1.2 checks every argument itself.
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE" to load this file. \quit

DROP FUNCTION htk_stats();

CREATE FUNCTION htk_stats(
    OUT steps bigint, OUT keys_computed bigint, OUT history_scored bigint, OUT history_skipped bigint,
    OUT grid_steps bigint, OUT knn_boundary_ties bigint, OUT kept_bytes bigint, OUT kept_sets integer,
    OUT kept_contexts integer, OUT evictions bigint)
AS 'MODULE_PATHNAME', 'htk_stats'
LANGUAGE C VOLATILE PARALLEL RESTRICTED;

COMMENT ON FUNCTION htk_stats() IS
    'This session''s counters of the native steps (steps, context keys computed, history atoms scored and skipped by exact pruning, steps that used the grid, KNN boundary ties) and the memory it keeps between calls (bytes, atom sets'' positions, context states; at most hartonomous_kernel.max_state_memory), with the entries dropped to stay within it.';

COMMENT ON FUNCTION htk_next_token(integer, integer, double precision, integer, boolean,
                                   double precision, double precision, integer[], double precision,
                                   integer, double precision, double precision, integer,
                                   double precision) IS
    'One next_token step in C for a set''s own parameters (rows layout): cached positions, keys, the KNN through SPI, kernel and sampler; NULL where the SQL path must serve it (sql/060_kernel.sql).';
