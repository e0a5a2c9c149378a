-- A memory of past generations beside an atom set (the tables: migrations/versions/0011, 0014).
--
--   remember(atom_set text, context integer[], generated integer[], path text,
--            max_atoms integer = NULL, weight float8 = NULL,
--            temperature float8 = NULL, top_k integer = NULL, top_p float8 = NULL,
--            repetition_penalty float8 = 1, adaptive boolean = false, ignore_eos boolean = false)
--   RETURNS TABLE(generation bigint, remembered integer, evicted integer, atoms bigint)
--   forget(atom_set text) RETURNS bigint
--   set_memory_bound(atom_set text, max_atoms integer) RETURNS bigint
--   set_memory_policy(atom_set text, min_temperature float8 = NULL, max_temperature float8 = NULL,
--                     min_top_p float8 = NULL, max_top_p float8 = NULL, max_top_k integer = NULL,
--                     allow_repetition_penalty boolean = NULL, allow_adaptive boolean = NULL,
--                     allow_ignore_eos boolean = NULL) RETURNS bigint
--   memory_policy(atom_set text = NULL)
--   RETURNS TABLE(min_temperature float8, max_temperature float8, min_top_p float8,
--                 max_top_p float8, max_top_k integer, allow_repetition_penalty boolean,
--                 allow_adaptive boolean, allow_ignore_eos boolean, set_at timestamptz)
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
--     mixes the store's guesses into the output (spatial, hybrid, augmented, any later one) is
--     refused: the list is a whitelist, so a new path is not remembered until it is added here on
--     purpose.
--  2a. Only under the owner's sampler policy. The caller states the settings the generation ran
--     with (temperature, top_k, top_p, repetition_penalty, adaptive, ignore_eos). temperature has
--     no default: a call that leaves it out is refused (22023 naming it), nothing is assumed. Left
--     out, top_k and top_p are off (NULL, the hottest: a sampling call must state them to pass the
--     default policy), repetition_penalty is 1 and adaptive and ignore_eos false; an explicit NULL
--     for these three is 22023 naming it. Each remembered atom records the settings. The set's policy
--     (memory_policies, written by the owner with set_memory_policy(); the default policy for a
--     set without a row) admits them when all of these hold:
--       - min_temperature <= temperature <= max_temperature;
--       - at temperature > 0 (sampling): min_top_p <= top_p <= max_top_p (NULL top_p is 1, off),
--         and, where max_top_k > 0, 1 <= top_k <= max_top_k (0 or NULL top_k is off: refused).
--         At temperature 0 (greedy) top-k and top-p change nothing and are not checked;
--       - repetition_penalty = 1, unless allow_repetition_penalty;
--       - not adaptive (risk-scored adaptive sampling explores hotter), unless allow_adaptive;
--       - not ignore_eos (tokens after the end of sequence), unless allow_ignore_eos.
--     The default policy: temperature 0 .. 1, top_p 0 .. 0.9, top_k at most 40, no repetition
--     penalty, no adaptive sampling, no ignore_eos: greedy and the sampler's defaults
--     (hartonomous/generation_config.py: T 1, top-k 40, top-p 0.9, penalty 1, what the server and
--     the CLI use when a request says nothing), nothing hotter. Settings it does not admit are
--     refused with SQLSTATE 42501 (insufficient privilege: the owner has not allowed them) and a
--     message saying which setting and what the policy admits; nothing is written. Bad settings
--     (a NaN, a negative temperature, NULL adaptive...) are 22023 as in rule 4.
--     set_memory_policy() sets the whole policy: an argument left NULL takes the default policy's
--     value; max_top_k 0 admits any top_k, off included. Bounds: 0 <= min_temperature <=
--     max_temperature <= 10^6, 0 <= min_top_p <= max_top_p <= 1 with max_top_p > 0, max_top_k
--     0 .. 10^6. It then forgets the generations remembered under settings the new policy refuses
--     (so the memory holds only what the set's policy admits) and returns the atoms removed.
--     memory_policy() returns the set's policy (set_at NULL: the default, never set).
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
--     other than exact or speculative, a sampler setting next_token would refuse (its messages),
--     a NULL adaptive or ignore_eos, max_atoms outside 1 .. 10^7 (NULL too, for
--     set_memory_bound), a weight that is not a positive finite number, a policy bound out of
--     range or out of order.
--  5. Privileges: remember(), forget(), set_memory_bound() and set_memory_policy() are for the
--     owner (the server's own writer connection); the reader role may not run them and has no
--     write access to memory_atoms, memory_bounds or memory_policies. It may SELECT them, which is
--     what next_token(..., memory => true) and draft_tokens(..., memory => true) read
--     (sql/015_knn.sql), and run memory_status() and memory_policy().
--  6. A set's memory lives in its own partition, memory_atoms_<id>, created by its first
--     remember() and dropped with the set (hartonomous atom-sets drop), as are its bound and policy.
--  7. Citus: every function here works on a coordinator. No write has an ON CONFLICT ... DO
--     UPDATE clause (Citus requires the functions of its SET IMMUTABLE, and now() is not):
--     set_memory_bound() and set_memory_policy() read the set's row, then update it or insert
--     one, under the set's memory lock, with the time read once into a variable.

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


CREATE OR REPLACE FUNCTION ht_memory_policy(p_set_id integer,
    OUT min_temperature double precision, OUT max_temperature double precision,
    OUT min_top_p double precision, OUT max_top_p double precision, OUT max_top_k integer,
    OUT allow_repetition_penalty boolean, OUT allow_adaptive boolean, OUT allow_ignore_eos boolean,
    OUT set_at timestamptz)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The set's sampler policy for its memory (rule 2a): its memory_policies row, else the default
-- policy (set_at NULL), the one home of its values. Where the table is absent (a database
-- downgraded below migration 0020) every set has the default.
#variable_conflict use_column
DECLARE
    p record;
BEGIN
    min_temperature := 0;  max_temperature := 1;
    min_top_p := 0;        max_top_p := 0.9;
    max_top_k := 40;
    allow_repetition_penalty := false;  allow_adaptive := false;  allow_ignore_eos := false;
    IF to_regclass('memory_policies') IS NOT NULL THEN
        SELECT mp.* INTO p FROM memory_policies mp WHERE mp.atom_set_id = p_set_id;
        IF FOUND THEN
            min_temperature := p.min_temperature;  max_temperature := p.max_temperature;
            min_top_p := p.min_top_p;              max_top_p := p.max_top_p;
            max_top_k := p.max_top_k;
            allow_repetition_penalty := p.allow_repetition_penalty;
            allow_adaptive := p.allow_adaptive;    allow_ignore_eos := p.allow_ignore_eos;
            set_at := p.set_at;
        END IF;
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION ht_memory_refusal(p_set_id integer, p_temperature double precision,
    p_top_k integer, p_top_p double precision, p_repetition_penalty double precision,
    p_adaptive boolean, p_ignore_eos boolean)
RETURNS text
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Why the set's policy does not admit these (valid) settings, or NULL where it does (rule 2a).
DECLARE
    p   record;
    v_p double precision := coalesce(p_top_p, 1);
BEGIN
    SELECT * INTO p FROM ht_memory_policy(p_set_id);
    IF p_temperature < p.min_temperature OR p_temperature > p.max_temperature THEN
        RETURN format('temperature %s is outside the set''s memory policy (%s .. %s)',
                      p_temperature, p.min_temperature, p.max_temperature);
    END IF;
    IF p_temperature > 0 AND (v_p < p.min_top_p OR v_p > p.max_top_p) THEN
        RETURN format('top_p %s is outside the set''s memory policy (%s .. %s) when sampling',
                      v_p, p.min_top_p, p.max_top_p);
    END IF;
    IF p_temperature > 0 AND p.max_top_k > 0 AND coalesce(p_top_k, 0) = 0 THEN
        RETURN format('top_k off is outside the set''s memory policy (top_k 1 .. %s) when sampling', p.max_top_k);
    END IF;
    IF p_temperature > 0 AND p.max_top_k > 0 AND p_top_k > p.max_top_k THEN
        RETURN format('top_k %s is outside the set''s memory policy (top_k 1 .. %s) when sampling',
                      p_top_k, p.max_top_k);
    END IF;
    IF p_repetition_penalty <> 1 AND NOT p.allow_repetition_penalty THEN
        RETURN format('repetition_penalty %s is not allowed by the set''s memory policy (only 1)',
                      p_repetition_penalty);
    END IF;
    IF p_adaptive AND NOT p.allow_adaptive THEN
        RETURN 'adaptive sampling is not allowed by the set''s memory policy';
    END IF;
    IF p_ignore_eos AND NOT p.allow_ignore_eos THEN
        RETURN 'ignore_eos is not allowed by the set''s memory policy';
    END IF;
    RETURN NULL;
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
-- Before 0020 the sampler settings were not stated (nor checked against the set's policy).
DROP FUNCTION IF EXISTS remember(text, integer[], integer[], text, integer, double precision);

CREATE OR REPLACE FUNCTION remember(
    atom_set text,
    context integer[],
    generated integer[],
    path text,
    max_atoms integer DEFAULT NULL,
    weight double precision DEFAULT NULL,
    temperature double precision DEFAULT NULL,
    top_k integer DEFAULT NULL,
    top_p double precision DEFAULT NULL,
    repetition_penalty double precision DEFAULT 1,
    adaptive boolean DEFAULT false,
    ignore_eos boolean DEFAULT false)
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
    v_refusal text;
BEGIN
    SELECT * INTO s FROM ht_memory_set(remember.atom_set);
    PERFORM ht_check_context(remember.context, 'context');
    PERFORM ht_check_context(remember.generated, 'generated');
    IF remember.path IS NULL OR remember.path NOT IN ('exact', 'speculative') THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('path must be exact or speculative, got %s',
                             coalesce(quote_literal(remember.path), 'NULL')),
            HINT = 'The memory holds only tokens the exact model chose; paths that mix the store''s guesses in (spatial, hybrid, augmented) are not remembered.';
    END IF;
    -- The settings the generation ran with (rule 2a): stated (NULL top_k and top_p: off), then
    -- next_token's rules and messages.
    IF remember.temperature IS NULL OR remember.repetition_penalty IS NULL
       OR remember.adaptive IS NULL OR remember.ignore_eos IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s must be stated: the sampler settings the generation ran with, got NULL',
                             CASE WHEN remember.temperature IS NULL THEN 'temperature'
                                  WHEN remember.repetition_penalty IS NULL THEN 'repetition_penalty'
                                  WHEN remember.adaptive IS NULL THEN 'adaptive' ELSE 'ignore_eos' END),
            HINT = 'Pass the settings the generation ran with (greedy: temperature => 0); the set''s memory policy is checked against them.';
    END IF;
    PERFORM ht_check_sampler_args(remember.temperature, remember.top_k, remember.top_p, NULL, 100,
                                  remember.repetition_penalty, NULL, NULL);
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
    v_refusal := ht_memory_refusal(s.id, remember.temperature, remember.top_k, remember.top_p,
                                   remember.repetition_penalty, remember.adaptive, remember.ignore_eos);
    IF v_refusal IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = 'not remembered: ' || v_refusal,
            DETAIL = format('The memory policy of atom set %s does not admit the settings the generation ran with; nothing was written.', quote_literal(s.name)),
            HINT = 'The memory keeps only what the exact model says under sampler settings the set''s owner allows: set_memory_policy() (the owner), memory_policy() shows it.';
    END IF;
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
    INSERT INTO memory_atoms (atom_set_id, generation, step, position, token_id, weight, path, route,
                              temperature, top_k, top_p, repetition_penalty, adaptive, ignore_eos)
    SELECT s.id, v_gen, k.i - 1, k.key, remember.generated[k.i], v_w, remember.path,
           CASE WHEN v_spread IS NOT NULL THEN ht_route_cell(ST_X(k.key), ST_Y(k.key), ST_Z(k.key))
                ELSE v_gen * 1048576 + k.i END,
           remember.temperature, remember.top_k, coalesce(remember.top_p, 1), remember.repetition_penalty,
           remember.adaptive, remember.ignore_eos
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
    v_now  timestamptz := now();
    v_old  integer;
BEGIN
    SELECT * INTO s FROM ht_memory_set(set_memory_bound.atom_set);
    PERFORM ht_check_between('max_atoms', set_memory_bound.max_atoms, 1, 10000000,
                             'max_atoms bounds the set''s memory, in atoms (one per remembered token).');
    PERFORM pg_advisory_xact_lock(hashtext('hartonomous.speculative.memory'), s.id);
    -- No ON CONFLICT ... DO UPDATE (rule 7): read, then update a changed bound or insert a new one.
    SELECT b.max_atoms INTO v_old FROM memory_bounds b WHERE b.atom_set_id = s.id;
    IF NOT FOUND THEN
        INSERT INTO memory_bounds (atom_set_id, max_atoms, set_at) VALUES (s.id, set_memory_bound.max_atoms, v_now);
    ELSIF v_old <> set_memory_bound.max_atoms THEN
        UPDATE memory_bounds b SET max_atoms = set_memory_bound.max_atoms, set_at = v_now WHERE b.atom_set_id = s.id;
    END IF;
    SELECT count(*) INTO v_have FROM memory_atoms m WHERE m.atom_set_id = s.id;
    RETURN ht_memory_evict(s.id, v_have - set_memory_bound.max_atoms);
END
$$;


CREATE OR REPLACE FUNCTION set_memory_policy(
    atom_set text,
    min_temperature double precision DEFAULT NULL,
    max_temperature double precision DEFAULT NULL,
    min_top_p double precision DEFAULT NULL,
    max_top_p double precision DEFAULT NULL,
    max_top_k integer DEFAULT NULL,
    allow_repetition_penalty boolean DEFAULT NULL,
    allow_adaptive boolean DEFAULT NULL,
    allow_ignore_eos boolean DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Set the set's sampler policy for its memory (the owner's; rule 2a): NULL arguments take the
-- default policy's values. Forgets the generations remembered under settings it refuses and
-- returns the atoms removed.
#variable_conflict use_column
DECLARE
    s       record;
    d       record;
    g       record;
    v_min_t double precision;
    v_max_t double precision;
    v_min_p double precision;
    v_max_p double precision;
    v_k     integer;
    v_rp    boolean;
    v_ad    boolean;
    v_ie    boolean;
    cur     record;
    v_now   timestamptz := now();
    v_gone  bigint[] := '{}';
    n       bigint;
BEGIN
    SELECT * INTO s FROM ht_memory_set(set_memory_policy.atom_set);
    SELECT * INTO d FROM ht_memory_policy(NULL);                 -- the default policy
    v_min_t := coalesce(set_memory_policy.min_temperature, d.min_temperature);
    v_max_t := coalesce(set_memory_policy.max_temperature, d.max_temperature);
    v_min_p := coalesce(set_memory_policy.min_top_p, d.min_top_p);
    v_max_p := coalesce(set_memory_policy.max_top_p, d.max_top_p);
    v_k := coalesce(set_memory_policy.max_top_k, d.max_top_k);
    IF NOT (v_min_t >= 0 AND v_min_t <= 1e6) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('min_temperature must be between 0 and 1e+06, got %s', v_min_t),
            HINT = 'NULL takes the default policy''s (0).';
    END IF;
    IF NOT (v_max_t >= v_min_t AND v_max_t <= 1e6) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('max_temperature must be between min_temperature (%s) and 1e+06, got %s', v_min_t, v_max_t),
            HINT = 'NULL takes the default policy''s (1); 0 admits greedy decoding only.';
    END IF;
    IF NOT (v_min_p >= 0 AND v_min_p <= 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('min_top_p must be between 0 and 1, got %s', v_min_p),
            HINT = 'NULL takes the default policy''s (0).';
    END IF;
    IF NOT (v_max_p >= v_min_p AND v_max_p > 0 AND v_max_p <= 1) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('max_top_p must be in (0, 1] and at least min_top_p (%s), got %s', v_min_p, v_max_p),
            HINT = 'NULL takes the default policy''s (0.9); 1 admits top-p off.';
    END IF;
    PERFORM ht_check_between('max_top_k', v_k, 0, 1000000,
                             'NULL takes the default policy''s (40); 0 admits any top_k, off included.');
    v_rp := coalesce(set_memory_policy.allow_repetition_penalty, d.allow_repetition_penalty);
    v_ad := coalesce(set_memory_policy.allow_adaptive, d.allow_adaptive);
    v_ie := coalesce(set_memory_policy.allow_ignore_eos, d.allow_ignore_eos);
    PERFORM pg_advisory_xact_lock(hashtext('hartonomous.speculative.memory'), s.id);
    -- No ON CONFLICT ... DO UPDATE (rule 7): read the set's row, then update it or insert one. An
    -- unchanged policy changes nothing (a server sets its configured one before each write).
    SELECT mp.* INTO cur FROM memory_policies mp WHERE mp.atom_set_id = s.id;
    IF FOUND THEN
        IF (cur.min_temperature, cur.max_temperature, cur.min_top_p, cur.max_top_p, cur.max_top_k,
            cur.allow_repetition_penalty, cur.allow_adaptive, cur.allow_ignore_eos)
           = (v_min_t, v_max_t, v_min_p, v_max_p, v_k, v_rp, v_ad, v_ie) THEN
            RETURN 0;
        END IF;
        UPDATE memory_policies AS mp
           SET min_temperature = v_min_t, max_temperature = v_max_t, min_top_p = v_min_p, max_top_p = v_max_p,
               max_top_k = v_k, allow_repetition_penalty = v_rp, allow_adaptive = v_ad, allow_ignore_eos = v_ie,
               set_at = v_now
         WHERE mp.atom_set_id = s.id;
    ELSE
        INSERT INTO memory_policies (atom_set_id, min_temperature, max_temperature, min_top_p, max_top_p,
                                     max_top_k, allow_repetition_penalty, allow_adaptive, allow_ignore_eos, set_at)
        VALUES (s.id, v_min_t, v_max_t, v_min_p, v_max_p, v_k, v_rp, v_ad, v_ie, v_now);
    END IF;
    -- The memory holds only what the policy admits: forget the generations it now refuses (their
    -- settings judged here, on this node; the DELETE names them by number).
    FOR g IN SELECT DISTINCT m.generation, m.temperature, m.top_k, m.top_p, m.repetition_penalty,
                             m.adaptive, m.ignore_eos
               FROM memory_atoms m WHERE m.atom_set_id = s.id LOOP
        IF ht_memory_refusal(s.id, g.temperature, g.top_k, g.top_p, g.repetition_penalty, g.adaptive,
                             g.ignore_eos) IS NOT NULL THEN
            v_gone := v_gone || g.generation;
        END IF;
    END LOOP;
    IF cardinality(v_gone) = 0 THEN
        RETURN 0;
    END IF;
    DELETE FROM memory_atoms m WHERE m.atom_set_id = s.id AND m.generation = ANY(v_gone);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;


CREATE OR REPLACE FUNCTION memory_policy(atom_set text DEFAULT NULL)
RETURNS TABLE(min_temperature double precision, max_temperature double precision,
              min_top_p double precision, max_top_p double precision, max_top_k integer,
              allow_repetition_penalty boolean, allow_adaptive boolean, allow_ignore_eos boolean,
              set_at timestamptz)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The set's sampler policy for its memory (set_at NULL: the default policy, never set).
DECLARE
    s record;
BEGIN
    SELECT * INTO s FROM ht_memory_set(memory_policy.atom_set);
    RETURN QUERY SELECT * FROM ht_memory_policy(s.id);
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
REVOKE EXECUTE ON FUNCTION remember(text, integer[], integer[], text, integer, double precision, double precision, integer, double precision, double precision, boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION set_memory_policy(text, double precision, double precision, double precision, double precision, integer, boolean, boolean, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION forget(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION set_memory_bound(text, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION ht_memory_evict(integer, bigint) FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hartonomous_reader') THEN
        REVOKE EXECUTE ON FUNCTION remember(text, integer[], integer[], text, integer, double precision, double precision, integer, double precision, double precision, boolean, boolean)
            FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION set_memory_policy(text, double precision, double precision, double precision, double precision, integer, boolean, boolean, boolean)
            FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION forget(text) FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION set_memory_bound(text, integer) FROM hartonomous_reader;
        REVOKE EXECUTE ON FUNCTION ht_memory_evict(integer, bigint) FROM hartonomous_reader;
    END IF;
END
$$;

COMMENT ON FUNCTION remember(text, integer[], integer[], text, integer, double precision, double precision, integer, double precision, double precision, boolean, boolean) IS
    'Store a completed exact or speculative generation in the atom set''s memory (one atom per generated token at the key of the text before it, recording the sampler settings it ran with), if the set''s memory policy admits those settings (else 42501, nothing written), evicting the oldest generations to stay within the set''s bound (memory_bounds; max_atoms may only lower it). Owner only. See docs/sql.md.';
COMMENT ON FUNCTION set_memory_policy(text, double precision, double precision, double precision, double precision, integer, boolean, boolean, boolean) IS
    'Set the atom set''s memory policy: the sampler settings under which remember() keeps a generation (NULL arguments: the default policy''s, greedy and the sampler defaults); forgets what it now refuses and returns the atoms removed. Owner only.';
COMMENT ON FUNCTION memory_policy(text) IS
    'The atom set''s memory policy: the sampler settings remember() admits (set_at NULL: the default policy).';
COMMENT ON FUNCTION forget(text) IS
    'Empty the atom set''s memory of past generations; returns the atoms removed. Owner only.';
COMMENT ON FUNCTION set_memory_bound(text, integer) IS
    'Set the atom set''s memory bound (max_atoms, 1..10^7; 100000 where never set), evicting the oldest generations down to it; returns the atoms evicted. Owner only.';
COMMENT ON FUNCTION memory_status(text) IS
    'How many atoms and generations the atom set''s memory holds, when the oldest and newest were remembered, and its bound.';
