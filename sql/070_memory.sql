-- A memory of past generations beside an atom set (the tables: migrations/versions/0011, 0014).
--
--   remember(atom_set text, context integer[], generated integer[], path text,
--            max_atoms integer = NULL, weight float8 = NULL)
--   RETURNS TABLE(generation bigint, remembered integer, evicted integer, atoms bigint)
--   forget(atom_set text) RETURNS bigint
--   set_memory_bound(atom_set text, max_atoms integer) RETURNS bigint
--   memory_status(atom_set text = NULL)
--   RETURNS TABLE(atoms bigint, generations bigint, oldest timestamptz, newest timestamptz,
--                 max_atoms integer)
--
-- Semantics:
--  1. remember() stores one atom per generated token: generated[k] at the key of the text before
--     it, context || generated[1 .. k-1], by the set's centroid window and decay. That is the
--     history atoms' key (ht_context_centroid's history_keys, sql/010_context_centroid.sql), so a
--     later context that ends like a remembered one lands where the remembered continuation lies.
--     Each atom weighs `weight` (NULL: the set's history_weight, or 1 where that is 0). All atoms
--     of one call share a generation number (a sequence: later calls get larger numbers).
--  2. Only the exact model's words: `path` is exact or speculative, the paths whose every token
--     the exact model chose (a speculative draft is kept only where the model agrees). A path that
--     mixes the store's guesses into the output (spatial, hybrid, any later one) is refused: the
--     list is a whitelist, so a new path is not remembered until it is added here on purpose.
--  3. Bounded by the set's bound: memory_bounds.max_atoms, written by the owner with
--     set_memory_bound() (100000 for a set without a row). After a remember() the set's memory
--     holds at most that many atoms, whatever the caller passes: the max_atoms argument may only
--     lower the bound for this call (NULL, the default: the set's bound). Whole generations are
--     evicted, the oldest (smallest number) first, until the new one fits; a generation longer
--     than the bound is refused. set_memory_bound() evicts the same way down to a lowered bound
--     and returns the atoms evicted. Calls for one set are serialised (an advisory lock), so the
--     bound holds under concurrent writers.
--  4. Bad input raises SQLSTATE 22023 naming the argument, before anything is written: an unknown
--     atom set, an empty or NULL-holding context or generated, a token id the set lacks, a path
--     other than exact or speculative, max_atoms outside 1 .. 10^7 (NULL too, for
--     set_memory_bound), a weight that is not a positive finite number.
--  5. Privileges: remember(), forget() and set_memory_bound() are for the owner (the server's own
--     writer connection); the reader role may not run them and has no write access to
--     memory_atoms or memory_bounds. It may SELECT both, which is what next_token(..., memory =>
--     true) and draft_tokens(..., memory => true) read (sql/015_knn.sql), and run memory_status().
--  6. A set's memory lives in its own partition, memory_atoms_<id>, created by its first
--     remember() and dropped with the set (hartonomous atom-sets drop), as is its bound.

CREATE OR REPLACE FUNCTION ht_memory_set(p_atom_set text, OUT id integer, OUT name text,
                                         OUT centroid_window integer,
                                         OUT centroid_decay double precision,
                                         OUT history_weight double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The named atom set (NULL: the default one), by ht_atom_set's rule and message.
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM ht_atom_set(p_atom_set);
    id := s.id;
    name := s.name;
    centroid_window := s.centroid_window;
    centroid_decay := s.centroid_decay;
    history_weight := (SELECT a.history_weight FROM atom_sets a WHERE a.id = s.id);
END
$$;


CREATE OR REPLACE FUNCTION ht_memory_bound(p_set_id integer)
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The set's memory bound: its memory_bounds row, else the default (100000 atoms). PL/pgSQL, not
-- SQL: migration 0002 installs it before 0014 creates the table.
BEGIN
    RETURN coalesce((SELECT b.max_atoms FROM memory_bounds b WHERE b.atom_set_id = p_set_id), 100000);
END
$$;


CREATE OR REPLACE FUNCTION ht_memory_evict(p_set_id integer, p_need bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Remove the set's oldest whole generations until at least p_need atoms are gone (or none is
-- left); the atoms removed. The caller holds the set's memory lock.
DECLARE
    n integer := 0;
BEGIN
    IF p_need > 0 THEN
        WITH per_generation AS (
            SELECT m.generation AS g, count(*) AS n
              FROM memory_atoms m WHERE m.atom_set_id = p_set_id GROUP BY m.generation
        ), oldest AS (
            SELECT p.g FROM (SELECT p.g, sum(p.n) OVER (ORDER BY p.g) - p.n AS before
                               FROM per_generation p) p
             WHERE p.before < p_need
        )
        DELETE FROM memory_atoms m USING oldest o
         WHERE m.atom_set_id = p_set_id AND m.generation = o.g;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    RETURN n;
END
$$;


-- Before 0014 max_atoms defaulted to 100000 on every call; it is NULL (the set's bound) now.
DROP FUNCTION IF EXISTS remember(text, integer[], integer[], text, integer, double precision);

CREATE OR REPLACE FUNCTION remember(
    atom_set text,
    context integer[],
    generated integer[],
    path text,
    max_atoms integer DEFAULT NULL,
    weight double precision DEFAULT NULL)
RETURNS TABLE(generation bigint, remembered integer, evicted integer, atoms bigint)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Store a completed generation in the set's memory; semantics at the top of this file.
#variable_conflict use_column
DECLARE
    s       record;
    c       record;
    v_w     double precision := remember.weight;
    v_g     integer := cardinality(remember.generated);
    v_bound integer;
    v_have  bigint;
    v_gen   bigint;
    v_part  text;
    v_spread double precision;
BEGIN
    SELECT * INTO s FROM ht_memory_set(remember.atom_set);
    PERFORM ht_check_context(remember.context, 'context');
    PERFORM ht_check_context(remember.generated, 'generated');
    IF remember.path IS NULL OR remember.path NOT IN ('exact', 'speculative') THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('path must be exact or speculative, got %s',
                             coalesce(quote_literal(remember.path), 'NULL')),
            HINT = 'The memory holds only tokens the exact model chose; paths that mix the store''s guesses in (spatial, hybrid) are not remembered.';
    END IF;
    IF remember.max_atoms IS NOT NULL THEN
        PERFORM ht_check_between('max_atoms', remember.max_atoms, 1, 10000000,
                                 'max_atoms may only lower the set''s memory bound for this call; NULL (the default) keeps it.');
    END IF;
    IF v_w IS NULL THEN
        v_w := CASE WHEN s.history_weight > 0 THEN s.history_weight ELSE 1 END;
    ELSIF NOT (v_w > 0 AND v_w < 'Infinity'::double precision) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('weight must be a positive finite number, got %s', v_w),
            HINT = 'Leave it NULL for the atom set''s history_weight.';
    END IF;
    PERFORM ht_check_known_tokens(s.id, remember.generated, 'generated',
                                  'Remember generations of the model the set was built from.');
    -- The keys (ht_context_centroid raises 22023 naming a context token the set lacks).
    SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay,
                                             remember.context || remember.generated, v_g);

    PERFORM pg_advisory_xact_lock(hashtext('hartonomous.speculative.memory'), s.id);
    v_bound := least(ht_memory_bound(s.id), remember.max_atoms);      -- least() ignores NULL
    IF v_g > v_bound THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('generated has %s tokens, more than max_atoms (%s) for atom set %s',
                             v_g, v_bound, quote_literal(s.name)),
            HINT = 'Remember a shorter generation, or raise the set''s bound with set_memory_bound() (the owner).';
    END IF;
    v_part := format('memory_atoms_%s', s.id);
    IF to_regclass(v_part) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF memory_atoms FOR VALUES IN (%s)', v_part, s.id);
    END IF;
    SELECT count(*) INTO v_have FROM memory_atoms m WHERE m.atom_set_id = s.id;
    evicted := ht_memory_evict(s.id, v_have + v_g - v_bound);
    v_gen := nextval('memory_generation_seq');
    -- route (migration 0018): on a set that routes, the key's cell (sql/015_knn.sql); every key of
    -- such a set lies within route_spread of its cell's centre (to rounding: 1e-12 is allowed, well
    -- inside the 1e-9 the routed KNN keeps to spare), and a key that did not would make the routed
    -- KNN's proof wrong, so it is refused rather than stored.
    SELECT a.route_spread INTO v_spread FROM atom_sets a WHERE a.id = s.id;
    IF v_spread IS NOT NULL AND EXISTS (
            SELECT 1 FROM unnest(c.history_keys) AS k(key)
             WHERE greatest(abs(ST_X(k.key) - round(ST_X(k.key))), abs(ST_Y(k.key) - round(ST_Y(k.key))),
                            abs(ST_Z(k.key) - round(ST_Z(k.key)))) > v_spread + 1e-12) THEN
        RAISE EXCEPTION 'a key of this generation lies farther than route_spread (%) from its lattice cell in atom set %',
            v_spread, quote_literal(s.name)
            USING HINT = 'The set''s route_spread does not hold for its keys; rebuild the set.';
    END IF;
    INSERT INTO memory_atoms (atom_set_id, generation, step, position, token_id, weight, path, route)
    SELECT s.id, v_gen, k.i - 1, k.key, remember.generated[k.i], v_w, remember.path,
           CASE WHEN v_spread IS NOT NULL THEN ht_route_cell(ST_X(k.key), ST_Y(k.key), ST_Z(k.key))
                ELSE v_gen * 1048576 + k.i END
      FROM unnest(c.history_keys) WITH ORDINALITY AS k(key, i);
    generation := v_gen;
    remembered := v_g;
    atoms := v_have - evicted + v_g;
    RETURN NEXT;
END
$$;


CREATE OR REPLACE FUNCTION set_memory_bound(atom_set text, max_atoms integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Set the set's memory bound (the owner's); evicts the oldest generations down to it and
-- returns the atoms evicted.
#variable_conflict use_column
DECLARE
    s      record;
    v_have bigint;
BEGIN
    SELECT * INTO s FROM ht_memory_set(set_memory_bound.atom_set);
    PERFORM ht_check_between('max_atoms', set_memory_bound.max_atoms, 1, 10000000,
                             'max_atoms bounds the set''s memory, in atoms (one per remembered token).');
    PERFORM pg_advisory_xact_lock(hashtext('hartonomous.speculative.memory'), s.id);
    INSERT INTO memory_bounds AS b (atom_set_id, max_atoms) VALUES (s.id, set_memory_bound.max_atoms)
        ON CONFLICT (atom_set_id) DO UPDATE SET max_atoms = excluded.max_atoms, set_at = now()
        WHERE b.max_atoms IS DISTINCT FROM excluded.max_atoms;
    SELECT count(*) INTO v_have FROM memory_atoms m WHERE m.atom_set_id = s.id;
    RETURN ht_memory_evict(s.id, v_have - set_memory_bound.max_atoms);
END
$$;


CREATE OR REPLACE FUNCTION forget(atom_set text)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Empty the set's memory (its bound stays); returns the number of atoms removed.
DECLARE
    s record;
    n bigint;
BEGIN
    SELECT * INTO s FROM ht_memory_set(forget.atom_set);
    PERFORM pg_advisory_xact_lock(hashtext('hartonomous.speculative.memory'), s.id);
    DELETE FROM memory_atoms m WHERE m.atom_set_id = s.id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


-- Before 0014 memory_status had no max_atoms column.
DROP FUNCTION IF EXISTS memory_status(text);

CREATE OR REPLACE FUNCTION memory_status(atom_set text DEFAULT NULL)
RETURNS TABLE(atoms bigint, generations bigint, oldest timestamptz, newest timestamptz, max_atoms integer)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- What the set's memory holds now, and its bound.
#variable_conflict use_column
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM ht_memory_set(memory_status.atom_set);
    RETURN QUERY
        SELECT count(*), count(DISTINCT m.generation), min(m.remembered_at), max(m.remembered_at),
               ht_memory_bound(s.id)
          FROM memory_atoms m WHERE m.atom_set_id = s.id;
END
$$;


-- Only the owner writes the memory and its bound: no EXECUTE for PUBLIC or the reader role (which
-- the default privileges of migration 0003 would otherwise grant). Migrations 0011 and 0014 revoke
-- it too, after 0003.
REVOKE EXECUTE ON FUNCTION remember(text, integer[], integer[], text, integer, double precision) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION forget(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION set_memory_bound(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ht_memory_evict(integer, bigint) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hartonomous_reader') THEN
        REVOKE EXECUTE ON FUNCTION remember(text, integer[], integer[], text, integer, double precision)
            FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION forget(text) FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION set_memory_bound(text, integer) FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION ht_memory_evict(integer, bigint) FROM hartonomous_reader;
    END IF;
END
$$;

COMMENT ON FUNCTION remember(text, integer[], integer[], text, integer, double precision) IS
    'Store a completed exact or speculative generation in the atom set''s memory (one atom per generated token at the key of the text before it), evicting the oldest generations to stay within the set''s bound (memory_bounds; max_atoms may only lower it). Owner only. See docs/sql.md.';
COMMENT ON FUNCTION forget(text) IS
    'Empty the atom set''s memory of past generations; returns the atoms removed. Owner only.';
COMMENT ON FUNCTION set_memory_bound(text, integer) IS
    'Set the atom set''s memory bound (max_atoms, 1..10^7; 100000 where never set), evicting the oldest generations down to it; returns the atoms evicted. Owner only.';
COMMENT ON FUNCTION memory_status(text) IS
    'How many atoms and generations the atom set''s memory holds, when the oldest and newest were remembered, and its bound.';
