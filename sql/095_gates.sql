-- The augmented path's gates: one fitted gate per atom set, beside it (the table: migration 0017).
--
--   save_gate(atom_set text, features text[], means float8[], scales float8[],
--             coefficients float8[], intercept float8, calibration_loss float8, exact_loss float8,
--             positions integer, split text, version integer, details jsonb = '{}')
--   RETURNS integer                                    -- the atom set's id
--
-- Semantics:
--  1. A gate is λ = σ(w · z + b) with z = (features − means) / scales (hartonomous/augment/gate.py,
--     the one definition; the database stores it and checks it, it does not evaluate it).
--  2. save_gate replaces the set's gate (one per set; atom sets stay immutable, the gate lives
--     beside them like the memory). It is for the owner: the reader may read augment_gates only.
--  3. Fitted on the calibration split only: split must be 'calibration' (never the test split or
--     a user's evaluation text, which would flatter the path).
--  4. Bad input raises SQLSTATE 22023 naming the argument, and nothing is written: an unknown
--     atom set, features empty or holding NULL or duplicates, means, scales or coefficients not
--     one per feature or not finite, a scale <= 0, an intercept or loss that is not finite,
--     positions < 1, a split other than 'calibration', a version < 1, details not an object.
--  5. Citus: a coordinator refuses a function that is not IMMUTABLE (now()) in the DO UPDATE SET of
--     an INSERT into a distributed or Citus local table (augment_gates references the reference
--     table atom_sets), so the replaced row takes every value, fitted_at too, from EXCLUDED.

CREATE OR REPLACE FUNCTION ht_check_finite_array(p_argument text, p_values double precision[], p_length integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- p_values: exactly p_length finite numbers (no NULL, NaN or infinity); raises 22023 naming it.
BEGIN
    IF p_values IS NULL OR cardinality(p_values) <> p_length OR array_ndims(p_values) <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must hold one number per feature (%s), got %s', p_argument, p_length,
                             coalesce(cardinality(p_values)::text, 'NULL'));
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_values) v WHERE v IS NULL OR v = 'NaN' OR v IN ('Infinity', '-Infinity')) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must be finite numbers, got %s', p_argument, p_values);
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION save_gate(
    atom_set text,
    features text[],
    means double precision[],
    scales double precision[],
    coefficients double precision[],
    intercept double precision,
    calibration_loss double precision,
    exact_loss double precision,
    positions integer,
    split text,
    version integer,
    details jsonb DEFAULT '{}')
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_id integer;
    n    integer;
BEGIN
    SELECT s.id INTO v_id FROM atom_sets s WHERE s.name = atom_set;
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('atom_set: no atom set named %s', coalesce(quote_literal(atom_set), 'NULL')),
            HINT = 'List them with: hartonomous atom-sets';
    END IF;
    n := cardinality(features);
    IF features IS NULL OR n = 0 OR array_ndims(features) <> 1
       OR EXISTS (SELECT 1 FROM unnest(features) f WHERE f IS NULL OR f = '')
       OR (SELECT count(DISTINCT f) FROM unnest(features) f) <> n THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'features must be a non-empty list of distinct feature names without NULLs';
    END IF;
    PERFORM ht_check_finite_array('means', means, n);
    PERFORM ht_check_finite_array('scales', scales, n);
    PERFORM ht_check_finite_array('coefficients', coefficients, n);
    IF EXISTS (SELECT 1 FROM unnest(scales) v WHERE v <= 0) THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('scales must be > 0, got %s', scales);
    END IF;
    PERFORM ht_check_finite_array('intercept', ARRAY[intercept], 1);
    PERFORM ht_check_finite_array('calibration_loss', ARRAY[calibration_loss], 1);
    PERFORM ht_check_finite_array('exact_loss', ARRAY[exact_loss], 1);
    IF positions IS NULL OR positions < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('positions must be >= 1, got %s', positions);
    END IF;
    IF split IS DISTINCT FROM 'calibration' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('split must be ''calibration'' (a gate is never fitted on the test split), got %s',
                             coalesce(quote_literal(split), 'NULL'));
    END IF;
    IF version IS NULL OR version < 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = format('version must be >= 1, got %s', version);
    END IF;
    IF details IS NULL OR jsonb_typeof(details) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'details must be a JSON object';
    END IF;
    INSERT INTO augment_gates AS g (atom_set_id, version, features, means, scales, coefficients, intercept,
                                    calibration_loss, exact_loss, positions, split, details)
    VALUES (v_id, version, features, means, scales, coefficients, intercept, calibration_loss, exact_loss,
            positions, split, details)
    ON CONFLICT (atom_set_id) DO UPDATE
       SET version = EXCLUDED.version, features = EXCLUDED.features, means = EXCLUDED.means,
           scales = EXCLUDED.scales, coefficients = EXCLUDED.coefficients, intercept = EXCLUDED.intercept,
           calibration_loss = EXCLUDED.calibration_loss, exact_loss = EXCLUDED.exact_loss,
           positions = EXCLUDED.positions, split = EXCLUDED.split, details = EXCLUDED.details,
           fitted_at = EXCLUDED.fitted_at;   -- its default, now(): no function in DO UPDATE SET (rule 5)
    RETURN v_id;
END
$$;

REVOKE EXECUTE ON FUNCTION save_gate(text, text[], double precision[], double precision[], double precision[],
                                     double precision, double precision, double precision, integer, text,
                                     integer, jsonb) FROM PUBLIC;
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hartonomous_reader') THEN
        REVOKE EXECUTE ON FUNCTION save_gate(text, text[], double precision[], double precision[],
                                             double precision[], double precision, double precision,
                                             double precision, integer, text, integer, jsonb)
            FROM hartonomous_reader;
    END IF;
END $$;
