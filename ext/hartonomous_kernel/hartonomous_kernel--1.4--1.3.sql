-- hartonomous_kernel 1.4 -> 1.3 (migration 0016's downgrade): without htk_store and htk_store_step.
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE TO '1.3'" to load this file. \quit

DROP FUNCTION htk_store(integer[], double precision[], integer[], double precision[], double precision[], boolean[], text, double precision, double precision, double precision);
DROP FUNCTION IF EXISTS htk_store_step(integer[], text, integer, double precision, integer, integer);
