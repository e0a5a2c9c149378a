-- hartonomous_kernel 1.4 -> 1.5 (migration 0019, the kernel's one version): the same functions, and the
-- library's 1.5 arithmetic (overflow refused as the SQL reference refuses it, checked casts, htk_pick's
-- checks). 1.4 was amended in place (htk_store_step came later), so a database that reached it before holds
-- 1.4 without htk_store_step: this update refuses it, and `hartonomous migrate` installs 1.5 afresh instead
-- (hartonomous/db/migrate.py ensure_native_kernel_on; the extension holds no data).
\echo Use "ALTER EXTENSION hartonomous_kernel UPDATE" to load this file. \quit

DO $$
BEGIN
    IF to_regprocedure('htk_store_step(integer[], text, integer, double precision, integer, integer)') IS NULL THEN
        RAISE EXCEPTION 'hartonomous_kernel 1.4 without htk_store_step (installed before 1.4 gained it) cannot be updated in place'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Run `hartonomous migrate`, which installs 1.5 afresh, or DROP EXTENSION hartonomous_kernel; CREATE EXTENSION hartonomous_kernel;';
    END IF;
END
$$;
