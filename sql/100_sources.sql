-- Citations: where the store's tokens came from, in the files of an indexed set and in its memory.
--
--   store_sources(context integer[], atom_set text = NULL, k integer = 5, token integer = NULL,
--                 memory boolean = true)
--   RETURNS TABLE(token_id integer, kind text, file_id integer, path text, line integer,
--                 token_offset integer, match_tokens integer, license text, license_source text,
--                 generation bigint, step integer, bandwidths double precision)
--   store_verbatim(tokens integer[], atom_set text = NULL, min_tokens integer = 20, k integer = 1)
--   RETURNS TABLE(start_index integer, length integer, file_id integer, path text, line integer,
--                 license text, license_source text)
--   ht_file_grams(token_ids integer[]) RETURNS integer[]      -- the occurrence index's keys (ht_gram_rows)
--
-- Semantics:
--  1. The files: the set's rows of atom_set_files (migration 0021) with split 'train', the files
--     whose atoms the store holds. A file's tokens are its token_ids; token_offset is 0-based into
--     them, and a token's line is i where line_starts[i] <= token_offset < line_starts[i + 1].
--  2. store_sources, with `token` given: q = context || token; with token NULL: q = context. The
--     match is the longest suffix s of q, of at least 2 tokens and at most the last 256 of q, that
--     occurs in a file (with token NULL: that occurs followed by another token of the file). Rows
--     of kind 'file' are the occurrences of s, at most k, ordered by file_id, then offset; each is
--     about the token after the matched context: the given token (its offset and line in the
--     file), or with token NULL the token that follows s there (token_id). match_tokens counts the
--     context tokens matched before it (cardinality(s) - 1 with a token, cardinality(s) without).
--     This is the longest stored suffix behind the store's distribution: the lattice keys are
--     those suffixes (at most the set's window long), and the backoff kernel counts the atoms of
--     the longest one. The search is exact within a bound on its work: it reads at most 16
--     files at the 8-gram level and 4 at the 4- and 2-gram levels (item 5; those of smallest
--     file_id among the files holding the level's gram: a match shorter than 8 tokens is a
--     common phrase, cited from its first files), and extends at most 64 occurrences a file of
--     the longest gram level found, so where more files hold a suffix (a popular line of
--     boilerplate) the longest match and its occurrences are those of these.
--  3. Rows of kind 'memory' (memory => true): the set's memory of past generations (memory_atoms,
--     sql/070_memory.sql): the atoms (of the given token, when one is given) at the key of context
--     (ht_context_centroid, the key next_token reads), within the backoff radius of the nearest
--     one (ht_backoff_radius with the set's bandwidth and decay), and only where that nearest lies
--     within the set's bandwidth: at most k, nearest first, newest generation first. They give the
--     generation and the step they were remembered at, and their distance in bandwidths; the file
--     columns are NULL. File rows come first.
--  4. store_verbatim: every run of at least min_tokens consecutive elements of `tokens` that
--     occurs verbatim in one file (the check a team runs before accepting generated code): maximal
--     runs (a run is not part of a longer one ending at the same place or later), start_index
--     0-based into tokens, with up to k files holding it (smallest file_id first) and the line of
--     its first token there. One row per (run, file).
--  5. The occurrence index (migration 0022): the keys ht_file_grams(token_ids) of each train file
--     under a GIN expression index on atom_set_files (atom_set_files_grams_gin, WHERE split =
--     'train': the keys are computed when a file is written, never stored in a column), and
--     atom_set_file_grams, per train file the tokens as 4-byte words (ht_token_bytes), kept by a
--     trigger on atom_set_files (insert, update, delete; the writer of the file table needs no
--     change) and deleted with the file (ON DELETE CASCADE). A key is a tree hash of a 2-, 4- or
--     8-gram, 20 bits for a 2-gram, 18 for a 4-gram and 16 for an 8-gram, with its length in the
--     bits above, so the GIN index holds at most 2^20 + 2^18 + 2^16 keys with compressed lists of files: its size
--     follows the (gram, file) pairs, not the grams, and few keys make those lists dense. A file
--     holding the keys of the needle's level gram and of the grams of the level below within it
--     (ht_needle_keys) is a candidate; candidates are searched for the gram itself (position()
--     over those words: C speed), in file_id order until the level's 16 or 4 hold it, so a hash
--     collision neither gives a wrong row nor takes a file's place (short keys cost a further
--     page of candidates now and then, not a result).
--  6. Bad input raises SQLSTATE 22023 naming the argument: context / tokens (ht_check_context, and
--     token ids outside the set's vocabulary), token (negative or outside it), k outside 1 .. 100,
--     min_tokens outside 2 .. 256, memory NULL, an unknown atom set (ht_atom_set).
--  7. Privileges: SECURITY INVOKER, read only; the reader role may call store_sources and
--     store_verbatim (it may SELECT atom_set_files and atom_set_file_grams, and write neither).
-- Work per call: at most three GIN lookups for the candidate files (a further one where a key
-- collides within the first 16 or 4), their tokens read once, one
-- byte search of each for the longest level's gram, then O(log 256) probes comparing bytes in
-- place at each occurrence; plus, with memory and a non-empty memory, the context's key and one
-- KNN. Measured in docs/repository.md ("Citations").


CREATE OR REPLACE FUNCTION ht_gram_rows(p_tokens integer[])
RETURNS TABLE(i bigint, k2 integer, k4 integer, k8 integer)
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Per position i (1-based) of p_tokens, the keys of the 2-, 4- and 8-grams that start there (NULL
-- where the gram would run past the end). A key is the gram's length tag (1, 2, 3) in the bits from
-- 20 up, above the low bits of a tree hash (20 for a 2-gram, 18 for a 4-gram, 16 for an 8-gram: the
-- longer grams are the most of a file's keys, and fewer keys make the GIN index's lists of files
-- dense; an 8-gram's candidates also hold the keys of its five 4-grams, so they rarely collide): h2 of the two tokens' hashint4, h4 of two h2, h8 of two h4, each pair
-- combined as hashint8(a * 1000003 # b) (hashint8 folds the halves of its argument, so the two are
-- mixed first). Window functions over one unnest: no slice of the array per gram.
WITH t AS (
    SELECT u.i, hashint4(u.x)::bigint AS x FROM unnest(p_tokens) WITH ORDINALITY AS u(x, i)
), g2 AS (
    SELECT t.i, hashint8((t.x * 1000003) # lead(t.x) OVER (ORDER BY t.i)) AS h2 FROM t
), g4 AS (
    SELECT g2.i, g2.h2, hashint8((g2.h2::bigint * 1000003) # lead(g2.h2, 2) OVER (ORDER BY g2.i)) AS h4
      FROM g2
), g8 AS (
    SELECT g4.i, g4.h2, g4.h4, hashint8((g4.h4::bigint * 1000003) # lead(g4.h4, 4) OVER (ORDER BY g4.i)) AS h8
      FROM g4
)
SELECT g8.i, (1 << 20) | (g8.h2 & 1048575), (2 << 20) | (g8.h4 & 262143), (3 << 20) | (g8.h8 & 65535)
  FROM g8
 ORDER BY g8.i
$$;


CREATE OR REPLACE FUNCTION ht_file_grams(p_tokens integer[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The distinct keys of every 2-, 4- and 8-gram of a file's tokens (ht_gram_rows), ascending.
BEGIN
    RETURN (SELECT coalesce(array_agg(DISTINCT v.k ORDER BY v.k), '{}')
              FROM ht_gram_rows(p_tokens) r, LATERAL (VALUES (r.k2), (r.k4), (r.k8)) AS v(k)
             WHERE v.k IS NOT NULL);
END
$$;


CREATE OR REPLACE FUNCTION ht_needle_keys(p_needle integer[])
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The keys a file holding a needle's (1-based) last 8, 4 or 2 tokens (the longest level it is long
-- enough for) must hold: that gram's, and those of every gram of the level below within it (a
-- file holding the gram holds them all; each added key makes a file that only collides rarer).
DECLARE
    m   integer := cardinality(p_needle);
    tag integer := CASE WHEN m >= 8 THEN 3 WHEN m >= 4 THEN 2 ELSE 1 END;
BEGIN
    RETURN (SELECT array_agg(DISTINCT v.k)
              FROM ht_gram_rows(p_needle[m - (1 << tag) + 1:m]) r,
                   LATERAL (VALUES (r.k2), (r.k4), (r.k8)) AS v(k)
             WHERE v.k IS NOT NULL AND v.k >> 20 >= tag - 1);
END
$$;


CREATE OR REPLACE FUNCTION ht_token_bytes(p_tokens integer[])
RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Token ids as 4-byte big-endian words, in order: what position() searches (item 5).
SELECT coalesce(string_agg(int4send(u.x), ''::bytea ORDER BY u.i), ''::bytea)
  FROM unnest(p_tokens) WITH ORDINALITY AS u(x, i)
$$;


CREATE OR REPLACE FUNCTION ht_offsets(p_hay bytea, p_needle bytea, p_limit integer)
RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- The 0-based token offsets (at most p_limit, ascending) where the tokens p_needle encodes occur in
-- those p_hay encodes (ht_token_bytes): a byte search, a hit kept only where it starts on a token.
DECLARE
    pos    integer := 1;
    hit    integer;
    found  integer[] := '{}';
BEGIN
    IF length(p_needle) = 0 OR length(p_needle) > length(p_hay) THEN
        RETURN found;
    END IF;
    LOOP
        hit := position(p_needle IN CASE WHEN pos = 1 THEN p_hay ELSE substr(p_hay, pos) END);
        EXIT WHEN hit = 0;
        hit := pos + hit - 1;
        IF (hit - 1) % 4 = 0 THEN
            found := found || (hit - 1) / 4;
            EXIT WHEN cardinality(found) >= p_limit;
            pos := hit + 4;
        ELSE
            pos := hit + 1;
        END IF;
    END LOOP;
    RETURN found;
END
$$;


CREATE OR REPLACE FUNCTION ht_file_grams_sync()
RETURNS trigger
LANGUAGE plpgsql SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- atom_set_files' trigger (item 5): a train file's keys in atom_set_file_grams, none for others.
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.token_ids IS NOT DISTINCT FROM OLD.token_ids
       AND NEW.split IS NOT DISTINCT FROM OLD.split THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        DELETE FROM atom_set_file_grams g WHERE g.atom_set_id = OLD.atom_set_id AND g.file_id = OLD.file_id;
    END IF;
    IF NEW.split = 'train' THEN
        INSERT INTO atom_set_file_grams (atom_set_id, file_id, tokens)
        VALUES (NEW.atom_set_id, NEW.file_id, ht_token_bytes(NEW.token_ids));
    END IF;
    RETURN NEW;
END
$$;


CREATE OR REPLACE FUNCTION ht_source_matches(p_set_id integer, p_needle integer[], p_k integer,
                                             p_follow boolean)
RETURNS TABLE(file_id integer, token_offset integer, match_tokens integer)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER ROWS 5
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
-- Item 2's search for a checked, 1-based needle of at least 2 tokens: the occurrences (file, 0-based
-- offset of the match's first token, its length) of its longest suffix found in a train file, at
-- most p_k; with p_follow, only occurrences a token of the file follows.
#variable_conflict use_column
DECLARE
    n      integer := cardinality(p_needle);
    nb     bytea := ht_token_bytes(p_needle);         -- suffix of length L: substr(nb, 4 (n - L) + 1)
    ids    integer[];                                 -- the candidate files of the level reached
    hays   bytea[];                                   -- their tokens, read once (ht_token_bytes)
    keep   integer[] := '{}';                         -- indexes into ids of the files holding the suffix
    cids   integer[];                                 -- a further page of files holding the keys
    chays  bytea[];
    keys   integer[];
    gram   bytea;
    cap    integer;
    after  integer;                                   -- the last file_id of the page before
    page   integer;
    probe  integer[];
    occ_at  integer[] := '{}';                       -- an occurrence's file (index into ids)
    occ_end integer[] := '{}';                       -- and where its match ends
    best   integer := 0;
    fail   integer := n + 1;                          -- a length no candidate holds
    lo     integer;
    hi     integer;
    mid    integer;
    i      integer;
    o      integer;
    rows   integer := 0;
BEGIN
    -- The longest of the 8-, 4- and 2-gram levels some file holds verbatim, and the first cap files
    -- (by file_id) holding it. The first cap files holding its keys, each checked by a byte search;
    -- where one of them only collides on the keys, pages of further files until cap hold the gram,
    -- so a collision takes no file's place.
    FOREACH lo IN ARRAY ARRAY[8, 4, 2] LOOP
        CONTINUE WHEN lo > n;
        cap := CASE WHEN lo = 8 THEN 16 ELSE 4 END;
        gram := substr(nb, 4 * (n - lo) + 1);
        SELECT array_agg(g.file_id ORDER BY g.file_id), array_agg(g.tokens ORDER BY g.file_id) INTO ids, hays
          FROM (SELECT f.file_id FROM atom_set_files f
                 WHERE f.atom_set_id + 0 = p_set_id       -- + 0: the GIN index, not the key's
                   AND f.split = 'train'
                   AND ht_file_grams(f.token_ids) @> ht_needle_keys(p_needle[n - lo + 1:n])
                 ORDER BY f.file_id LIMIT cap) c
          JOIN atom_set_file_grams g ON g.atom_set_id = p_set_id AND g.file_id = c.file_id;
        IF ids IS NOT NULL THEN
            keep := '{}';
            FOR j IN 1 .. cardinality(ids) LOOP
                IF cardinality(ht_offsets(hays[j], gram, 1)) > 0 THEN
                    keep := keep || j;
                END IF;
            END LOOP;
            IF cardinality(keep) < cardinality(ids) AND cardinality(ids) = cap THEN
                -- A collision among a full page: the holders, then pages after it (4 times as long).
                keys := ht_needle_keys(p_needle[n - lo + 1:n]);
                after := ids[cap];
                page := cap;
                cids := ARRAY(SELECT ids[j] FROM unnest(keep) j);
                chays := ARRAY(SELECT hays[j] FROM unnest(keep) j);
                ids := cids;
                hays := chays;
                WHILE cardinality(ids) < cap LOOP
                    page := page * 4;
                    SELECT array_agg(g.file_id ORDER BY g.file_id), array_agg(g.tokens ORDER BY g.file_id)
                      INTO cids, chays
                      FROM (SELECT f.file_id FROM atom_set_files f
                             WHERE f.atom_set_id + 0 = p_set_id
                               AND f.split = 'train'
                               AND ht_file_grams(f.token_ids) @> keys
                               AND f.file_id > after
                             ORDER BY f.file_id LIMIT page) c
                      JOIN atom_set_file_grams g ON g.atom_set_id = p_set_id AND g.file_id = c.file_id;
                    EXIT WHEN cids IS NULL;
                    FOR j IN 1 .. cardinality(cids) LOOP
                        CONTINUE WHEN cardinality(ht_offsets(chays[j], gram, 1)) = 0;
                        ids := ids || cids[j];
                        hays := hays || chays[j];
                        EXIT WHEN cardinality(ids) = cap;
                    END LOOP;
                    EXIT WHEN cardinality(cids) < page;
                    after := cids[cardinality(cids)];
                END LOOP;
                keep := ARRAY(SELECT generate_series(1, cardinality(ids)));
            END IF;
            IF cardinality(keep) > 0 THEN
                best := lo;
                EXIT;
            END IF;
        END IF;
        fail := lo;
    END LOOP;
    IF best = 0 THEN
        RETURN;
    END IF;
    -- Every occurrence at that level (at most 64 a file), by its end e (0-based, exclusive): a longer
    -- suffix ends there too, so a probe compares bytes in place. Double, then halve the gap.
    FOREACH i IN ARRAY keep LOOP
        FOREACH o IN ARRAY ht_offsets(hays[i], substr(nb, 4 * (n - best) + 1), 64) LOOP
            occ_at := occ_at || i;
            occ_end := occ_end || (o + best);
        END LOOP;
    END LOOP;
    lo := best;
    hi := fail;                                    -- the shortest length known not to occur
    WHILE lo + 1 < hi LOOP
        mid := CASE WHEN hi = n + 1 AND lo * 2 < n THEN lo * 2 ELSE (lo + hi) / 2 END;
        probe := '{}';
        FOR j IN 1 .. cardinality(occ_at) LOOP
            IF occ_end[j] >= mid
               AND substr(hays[occ_at[j]], 4 * (occ_end[j] - mid) + 1, 4 * mid) = substr(nb, 4 * (n - mid) + 1) THEN
                probe := probe || j;
            END IF;
        END LOOP;
        IF cardinality(probe) = 0 THEN
            hi := mid;
        ELSE
            lo := mid;
            occ_at := ARRAY(SELECT occ_at[j] FROM unnest(probe) j);
            occ_end := ARRAY(SELECT occ_end[j] FROM unnest(probe) j);
        END IF;
    END LOOP;
    FOR j IN 1 .. cardinality(occ_at) LOOP         -- files ascend, and each file's occurrences
        CONTINUE WHEN p_follow AND occ_end[j] >= length(hays[occ_at[j]]) / 4;
        file_id := ids[occ_at[j]];
        token_offset := occ_end[j] - lo;
        match_tokens := lo;
        RETURN NEXT;
        rows := rows + 1;
        IF rows >= p_k THEN
            RETURN;
        END IF;
    END LOOP;
END
$$;


CREATE OR REPLACE FUNCTION ht_check_set_tokens(p_set_id integer, p_tokens integer[], p_argument text)
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
AS $$
-- Every element a token id of the set's vocabulary (0 .. vocab_size - 1); else 22023 naming it.
DECLARE
    v_vocab integer := (SELECT s.vocab_size FROM atom_sets s WHERE s.id = p_set_id);
    v_bad   integer;
BEGIN
    IF (SELECT min(x) >= 0 AND max(x) < v_vocab FROM unnest(p_tokens) x) THEN
        RETURN;
    END IF;
    SELECT i INTO v_bad FROM generate_subscripts(p_tokens, 1) i
     WHERE p_tokens[i] < 0 OR p_tokens[i] >= v_vocab ORDER BY i LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s: token id %s (element %s) is not in the atom set''s vocabulary (0 .. %s)',
                             p_argument, p_tokens[v_bad], v_bad - array_lower(p_tokens, 1) + 1, v_vocab - 1),
            HINT = 'Tokenize with the atom set''s model (see atom_sets.model) or pick another atom_set.';
    END IF;
END
$$;


CREATE OR REPLACE FUNCTION store_sources(
    context integer[],
    atom_set text DEFAULT NULL,
    k integer DEFAULT 5,
    token integer DEFAULT NULL,
    memory boolean DEFAULT true)
RETURNS TABLE(token_id integer, kind text, file_id integer, path text, line integer,
              token_offset integer, match_tokens integer, license text, license_source text,
              generation bigint, step integer, bandwidths double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_seqscan = off
AS $$
-- Where the store's tokens after `context` came from; semantics at the top of this file.
#variable_conflict use_column
DECLARE
    s      record;
    ctx    integer[];
    needle integer[];
    c      record;
    near   double precision;
    radius double precision;
    vocab  integer;
BEGIN
    PERFORM ht_check_context(context);
    PERFORM ht_check_between('k', k, 1, 100,
        'It bounds the rows of each kind: the file occurrences and the memory entries (5 by default).');
    PERFORM ht_check_memory(store_sources.memory,
        'true (the default) also lists the set''s memory entries behind the token; false lists files only.');
    SELECT * INTO s FROM ht_atom_set(atom_set);
    ctx := context[array_lower(context, 1):array_upper(context, 1)];
    PERFORM ht_check_set_tokens(s.id, ctx, 'context');
    vocab := (SELECT a.vocab_size FROM atom_sets a WHERE a.id = s.id);
    IF token IS NOT NULL AND (token < 0 OR token >= vocab) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('token: token id %s is not in the atom set''s vocabulary (0 .. %s)', token, vocab - 1),
            HINT = 'Pass the generated token whose sources you want, or NULL for the tokens the store would follow the context with.';
    END IF;
    needle := CASE WHEN token IS NULL THEN ctx ELSE ctx || token END;
    needle := needle[greatest(1, cardinality(needle) - 255):cardinality(needle)];
    IF cardinality(needle) >= 2 THEN
        RETURN QUERY
        SELECT CASE WHEN token IS NULL THEN f.token_ids[m.token_offset + m.match_tokens + 1] ELSE token END,
               'file'::text, f.file_id, f.path,
               width_bucket(m.token_offset + m.match_tokens - (token IS NOT NULL)::integer, f.line_starts),
               m.token_offset + m.match_tokens - (token IS NOT NULL)::integer,
               m.match_tokens - (token IS NOT NULL)::integer,
               f.license, f.license_source, NULL::bigint, NULL::integer, NULL::double precision
          FROM ht_source_matches(s.id, needle, k, token IS NULL) m
          JOIN atom_set_files f ON f.atom_set_id = s.id AND f.file_id = m.file_id
         ORDER BY m.file_id, m.token_offset;
    END IF;
    IF store_sources.memory AND EXISTS (SELECT 1 FROM memory_atoms a WHERE a.atom_set_id = s.id) THEN
        SELECT * INTO c FROM ht_context_centroid(s.id, s.centroid_window, s.centroid_decay, ctx, 0);
        SELECT min(a.position <<->> c.center) INTO near
          FROM (SELECT a.position FROM memory_atoms a
                 WHERE a.atom_set_id = s.id AND (token IS NULL OR a.token_id = token)
                 ORDER BY a.position <<->> c.center LIMIT 1) a;
        IF near IS NOT NULL AND near <= s.bandwidth THEN
            radius := ht_backoff_radius(near, s.bandwidth, s.centroid_decay);
            RETURN QUERY
            SELECT m.token_id, 'memory'::text, NULL::integer, NULL::text, NULL::integer, NULL::integer,
                   NULL::integer, NULL::text, NULL::text, m.generation, m.step, m.d / s.bandwidth
              FROM (SELECT a.token_id, a.generation, a.step, a.position <<->> c.center AS d
                      FROM memory_atoms a
                     WHERE a.atom_set_id = s.id AND (token IS NULL OR a.token_id = token)
                     ORDER BY a.position <<->> c.center
                     LIMIT 10 * k) m
             WHERE m.d <= radius
             ORDER BY m.d, m.generation DESC, m.step
             LIMIT k;
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION store_sources(integer[], text, integer, integer, boolean) IS
    'Where the store''s tokens after a context came from: the files and lines of the longest stored suffix of context (|| token) in the set''s training files, and the memory entries (generation, step) at the context''s key. See sql/100_sources.sql.';


CREATE OR REPLACE FUNCTION store_verbatim(
    tokens integer[],
    atom_set text DEFAULT NULL,
    min_tokens integer DEFAULT 20,
    k integer DEFAULT 1)
RETURNS TABLE(start_index integer, length integer, file_id integer, path text, line integer,
              license text, license_source text)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
-- Runs of `tokens` stored verbatim in one file (item 4).
#variable_conflict use_column
DECLARE
    s     record;
    toks  integer[];
    n     integer;
    len   integer[];
    m     record;
    run   integer;
BEGIN
    PERFORM ht_check_context(tokens, 'tokens');
    PERFORM ht_check_between('min_tokens', min_tokens, 2, 256,
        'The shortest run reported: 20 (the default) is the length a team checks before accepting code.');
    PERFORM ht_check_between('k', k, 1, 100, 'The files listed per run (1 by default).');
    SELECT * INTO s FROM ht_atom_set(atom_set);
    toks := tokens[array_lower(tokens, 1):array_upper(tokens, 1)];
    PERFORM ht_check_set_tokens(s.id, toks, 'tokens');
    n := cardinality(toks);
    len := array_fill(0, ARRAY[n]);
    -- len[i]: the longest suffix of toks[1:i] stored verbatim (at most its last 256 tokens).
    FOR i IN 2 .. n LOOP
        SELECT max(x.match_tokens) INTO run
          FROM ht_source_matches(s.id, toks[greatest(1, i - 255):i], 1, false) x;
        len[i] := coalesce(run, 0);
    END LOOP;
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN len[i] < min_tokens OR (i < n AND len[i + 1] = len[i] + 1);
        RETURN QUERY
        SELECT i - len[i], len[i], f.file_id, f.path, width_bucket(m.token_offset, f.line_starts),
               f.license, f.license_source
          FROM ht_source_matches(s.id, toks[i - len[i] + 1:i], k, false) m
          JOIN atom_set_files f ON f.atom_set_id = s.id AND f.file_id = m.file_id
         ORDER BY m.file_id, m.token_offset;
    END LOOP;
END
$$;

COMMENT ON FUNCTION store_verbatim(integer[], text, integer, integer) IS
    'Runs of at least min_tokens consecutive tokens stored verbatim in one of the set''s training files, with the file, the line and its license. See sql/100_sources.sql.';
