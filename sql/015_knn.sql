-- The KNN of next_token: the stored atoms of a set nearest to a point, in either storage layout.
--
--   ht_knn(p_set_id integer, p_center geometry, p_k integer, p_radius float8 = NULL,
--          p_memory boolean = false)
--   RETURNS TABLE(token_id integer, weight float8, distance float8)
--
-- Semantics (the one definition both layouts implement, so next_token's result does not depend
-- on the layout, bit for bit):
--  1. distance is the 3D distance from the atom to p_center, exactly as PostGIS's
--     `position <<->> p_center` computes it for two POINT Zs:
--     sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy) + (z - cz) * (z - cz)) in float8 (a square
--     that underflows is 0, as in C).
--  2. The atoms are ordered by (distance, token_id, weight); the first p_k are returned, in that
--     order. Ties in distance are broken by token_id, then weight: atoms equal in all three are
--     interchangeable for next_token, so the rows (and their order, which decides the rounding of
--     the kernel's sums) are a function of the atom set and the point alone. Before this file the
--     rows layout took whichever tied atoms the GiST scan met first.
--  3. p_radius (NULL: none) drops the returned atoms farther than p_radius; the K nearest within
--     the radius are the K nearest overall that lie within it, so a layout may stop early.
--  4. p_memory = true: the atoms are the set's stored atoms and its memory of past generations
--     (memory_atoms, sql/070_memory.sql) together, under rules 1-3; a memory atom is an atom like
--     any other (its token id, its weight, its distance). false (the default everywhere): the
--     stored atoms only, so results depend on the atom set alone.
--
-- Layouts (atom_sets.layout, chosen at build time; hartonomous/atomset/write.py writes both):
--  rows:  one row per atom in the set's `atoms` partition, GiST nd over the points:
--         ORDER BY position <<->> c, token_id, weight LIMIT k (an incremental sort of the index
--         scan's distance order breaks the ties). Every neighbour is a heap fetch.
--  tiles: the same atoms also packed along the Hilbert curve into tiles (atom_tiles, one row
--         and one page per tile: a MULTIPOINT Z of its atoms plus the atoms unpacked into arrays).
--         The GiST nd index over the tiles' boxes yields tiles in order of `atoms <<->> c`, the
--         exact distance from c to the tile's nearest atom (PostGIS rechecks the box bound with
--         the geometry). ht_knn reads tiles in that order, and once it holds k atoms it
--         knows an upper bound b of the k-th distance (the k-th smallest distance among them);
--         every atom at distance <= b lies in a tile whose nearest atom is <= b, so it reads on
--         until the next tile's distance exceeds b (or p_radius) and returns the first k of what
--         it read in the order of rule 2: exactly the rows layout's atoms. Work: the tiles that
--         reach within b of c, a handful at 10^6 atoms (docs/benchmarks.md), each one buffer.

-- Routing on Citus (migration 0018, docs/scale-out.md). On a set that routes
-- (atom_sets.route_spread: a lattice set, every key within route_spread < 1/2 of its cell's
-- centre on each axis), atoms.route and memory_atoms.route hold the cell code of the atom's
-- position (ht_route_cell of its rounded coordinates), and on a Citus coordinator both tables are
-- distributed by it: a cell's atoms lie on one shard. There (ht_routes() is true) the KNN first
-- reads only the cell of the centre c, a router query to one worker (ht_knn_routed), and keeps
-- that answer only where it is provably the fan-out's:
--   an atom of another cell differs from c's cell by at least 1 on some axis and lies within
--   route_spread of its own cell's centre, so it is at least
--       sep = 1 - route_spread - max_i |c_i - round(c_i)|
--   from c. The cell's answer is the whole one when (a) the radius is below sep, or (b) it holds
--   k atoms and the k-th is nearer than sep (no other atom can displace one), or (c) the kernel
--   is backoff and the radius it cuts at, from the cell's nearest atom, is below sep (a nearer
--   history atom only lowers it): every atom the kernel counts is in the cell, and the atoms of
--   other cells the fan-out would add are not counted.
-- Otherwise the call fans out to every shard, as on a set that does not route. Each decision is
-- counted for the session (knn_routing()). Under (c) ht_knn's rows are the cell's, possibly fewer
-- than the k nearest overall: every row the backoff kernel counts is among them, and the rows of
-- other cells that the fan-out would add are ones it cuts; every caller here applies that cut. On a single node ht_routes() is false and nothing of this
-- runs.

CREATE OR REPLACE FUNCTION ht_routes()
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = public, pg_temp
AS 'SELECT false' -- ht_routes: true where installed on a Citus coordinator
;

COMMENT ON FUNCTION ht_routes() IS
    'Whether the KNN of a set that routes reads its cell first (true where sql/ was installed on a Citus coordinator: hartonomous/db/citus.py).';


CREATE OR REPLACE FUNCTION ht_route_cell(p_x double precision, p_y double precision, p_z double precision)
RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = public, pg_temp
RETURN ((round(p_x)::bigint + 1048576) * 4398046511104)
       + ((round(p_y)::bigint + 1048576) * 2097152) + (round(p_z)::bigint + 1048576);

COMMENT ON FUNCTION ht_route_cell(double precision, double precision, double precision) IS
    'The routing key of a point of a set that routes: its rounded coordinates (each within 2^20 of 0, rounding half to even) packed 21 bits each; hartonomous/atomset/routing.py computes the same for the build.';


CREATE OR REPLACE FUNCTION ht_count_knn(p_routed boolean)
RETURNS void
LANGUAGE sql VOLATILE PARALLEL UNSAFE
SET search_path = public, pg_temp
AS $$
SELECT set_config(v.name, (coalesce(nullif(current_setting(v.name, true), ''), '0')::bigint + 1)::text, false)
  FROM (VALUES (CASE WHEN p_routed THEN 'hartonomous.knn_routed' ELSE 'hartonomous.knn_fanned_out' END)) AS v(name);
$$;


CREATE OR REPLACE FUNCTION knn_routing(OUT routed bigint, OUT fanned_out bigint)
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = public, pg_temp
AS $$
SELECT coalesce(nullif(current_setting('hartonomous.knn_routed', true), ''), '0')::bigint,
       coalesce(nullif(current_setting('hartonomous.knn_fanned_out', true), ''), '0')::bigint;
$$;

COMMENT ON FUNCTION knn_routing() IS
    'This session''s KNNs of sets that route, on a Citus coordinator: answered by one cell (one worker) and fanned out to every shard because the cell''s answer could not be proven whole (sql/015_knn.sql). SET hartonomous.knn_routed = 0 (and knn_fanned_out) to start over.';


CREATE OR REPLACE FUNCTION ht_knn_routed(
    p_set_id integer, p_center geometry, p_k integer, p_radius double precision, p_memory boolean,
    OUT token_ids integer[], OUT weights double precision[], OUT distances double precision[],
    OUT memory boolean[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_sort = off
AS $$
-- ht_knn's rows (rule 4's order, memory[i]: row i is a memory atom, stored atoms first at a full
-- tie) from the centre's cell alone where that is provably the whole answer (top of file); all
-- NULL where the set does not route or the answer is not proven, and the caller fans out.
#variable_conflict use_column
DECLARE
    s     record;
    cx    double precision := ST_X(p_center);
    cy    double precision := ST_Y(p_center);
    cz    double precision := ST_Z(p_center);
    v_cell bigint;
    v_box  geometry;
    v_sep  double precision;
    n      integer;
BEGIN
    SELECT a.route_spread, a.kernel, a.bandwidth, a.centroid_decay INTO s FROM atom_sets a WHERE a.id = p_set_id;
    IF s.route_spread IS NULL OR greatest(abs(cx), abs(cy), abs(cz)) >= 1048575 THEN
        RETURN;
    END IF;
    v_cell := ht_route_cell(cx, cy, cz);
    -- The cell's cube: its atoms lie inside; the GiST scan stops at its border.
    v_box := ST_MakeLine(ST_MakePoint(round(cx) - 0.5, round(cy) - 0.5, round(cz) - 0.5),
                         ST_MakePoint(round(cx) + 0.5, round(cy) + 0.5, round(cz) + 0.5));
    -- (1e-9 to spare for rounding, as in C)
    v_sep := 1 - s.route_spread - greatest(abs(cx - round(cx)), abs(cy - round(cy)), abs(cz - round(cz))) - 1e-9;
    IF NOT p_memory THEN
        SELECT coalesce(array_agg(n.tid ORDER BY n.d, n.tid, n.w), '{}'),
               coalesce(array_agg(n.w ORDER BY n.d, n.tid, n.w), '{}'),
               coalesce(array_agg(n.d ORDER BY n.d, n.tid, n.w), '{}')
          INTO token_ids, weights, distances
          FROM (SELECT n.tid, n.w, n.d
                  FROM (SELECT a.token_id AS tid, a.weight AS w, a.position <<->> p_center AS d
                          FROM atoms a
                         WHERE a.atom_set_id = p_set_id AND a.route = v_cell AND a.position &&& v_box
                         ORDER BY a.position <<->> p_center) n
                 WHERE p_radius IS NULL OR n.d <= p_radius
                 ORDER BY n.d, n.tid, n.w
                 LIMIT p_k) n;
        memory := array_fill(false, ARRAY[cardinality(token_ids)]);
    ELSE
        SELECT coalesce(array_agg(u.tid ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
               coalesce(array_agg(u.w ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
               coalesce(array_agg(u.d ORDER BY u.d, u.tid, u.w, u.mem), '{}'),
               coalesce(array_agg(u.mem ORDER BY u.d, u.tid, u.w, u.mem), '{}')
          INTO token_ids, weights, distances, memory
          FROM (SELECT u.tid, u.w, u.d, u.mem
                  FROM ((SELECT n.tid, n.w, n.d, false AS mem
                           FROM (SELECT a.token_id AS tid, a.weight AS w, a.position <<->> p_center AS d
                                   FROM atoms a
                                  WHERE a.atom_set_id = p_set_id AND a.route = v_cell AND a.position &&& v_box
                                  ORDER BY a.position <<->> p_center) n
                          WHERE p_radius IS NULL OR n.d <= p_radius
                          ORDER BY n.d, n.tid, n.w
                          LIMIT p_k)
                        UNION ALL
                        (SELECT n.tid, n.w, n.d, true
                           FROM (SELECT m.token_id AS tid, m.weight AS w, m.position <<->> p_center AS d
                                   FROM memory_atoms m
                                  WHERE m.atom_set_id = p_set_id AND m.route = v_cell AND m.position &&& v_box
                                  ORDER BY m.position <<->> p_center) n
                          WHERE p_radius IS NULL OR n.d <= p_radius
                          ORDER BY n.d, n.tid, n.w
                          LIMIT p_k)) u
                 ORDER BY u.d, u.tid, u.w, u.mem
                 LIMIT p_k) u;
    END IF;
    n := cardinality(token_ids);
    IF (p_radius IS NOT NULL AND p_radius < v_sep)
       OR (n >= p_k AND distances[p_k] < v_sep)
       OR (s.kernel = 'backoff' AND n > 0
           AND ht_backoff_radius(distances[1], s.bandwidth, s.centroid_decay) < v_sep) THEN
        PERFORM ht_count_knn(true);
        RETURN;
    END IF;
    PERFORM ht_count_knn(false);
    token_ids := NULL;
    weights := NULL;
    distances := NULL;
    memory := NULL;
END
$$;

-- ht_knn and ht_knn_arrays gained p_memory; CREATE OR REPLACE cannot change a signature, so the
-- versions a database installed before are dropped.
DROP FUNCTION IF EXISTS ht_knn(integer, geometry, integer, double precision);
DROP FUNCTION IF EXISTS ht_knn_arrays(integer, geometry, integer, double precision);

CREATE OR REPLACE FUNCTION ht_knn(
    p_set_id integer, p_center geometry, p_k integer, p_radius double precision DEFAULT NULL,
    p_memory boolean DEFAULT false)
RETURNS TABLE(token_id integer, weight double precision, distance double precision)
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_sort = off
AS $$
-- The p_k stored atoms of set p_set_id nearest to p_center, by the set's layout (top of file);
-- with p_memory, of its stored atoms and its memory together (rule 4).
#variable_conflict use_column
DECLARE
    tiles CURSOR FOR
        SELECT t.atoms <<->> p_center AS d, t.xs, t.ys, t.zs, t.token_ids, t.weights
          FROM atom_tiles t
         WHERE t.atom_set_id = p_set_id
         ORDER BY t.atoms <<->> p_center;
    tile  record;
    cx    double precision := ST_X(p_center);
    cy    double precision := ST_Y(p_center);
    cz    double precision := ST_Z(p_center);
    xs    double precision[] := '{}';
    ys    double precision[] := '{}';
    zs    double precision[] := '{}';
    tids  integer[] := '{}';
    ws    double precision[] := '{}';
    bound double precision;       -- once p_k atoms are in hand: the p_k-th smallest distance
    -- PostgreSQL raises where a float8 product underflows to 0; C (PostGIS) gives 0. A square
    -- d * d underflows exactly when 0 < |d| < sq0, which needs a coordinate of the centre below
    -- ~1.5e-146 in magnitude (else two distinct coordinates differ by more than sq0): only then
    -- are the squares guarded (to the same 0).
    sq0   constant double precision := 1.5717277847026288e-162;
    tiny  constant boolean := least(abs(ST_X(p_center)), abs(ST_Y(p_center)), abs(ST_Z(p_center))) < 1e-145;
    routed record;
BEGIN
    IF ht_routes() THEN  -- a Citus coordinator: the centre's cell alone where that is the whole answer
        SELECT * INTO routed FROM ht_knn_routed(p_set_id, p_center, p_k, p_radius, p_memory);
        IF routed.token_ids IS NOT NULL THEN
            RETURN QUERY SELECT u.tid, u.w, u.d FROM unnest(routed.token_ids, routed.weights, routed.distances) AS u(tid, w, d);
            RETURN;
        END IF;
    END IF;
    IF p_memory THEN
        -- Rule 4: the p_k nearest of the stored atoms and the memory's together. Each side's p_k
        -- nearest (the memory by its own GiST nd index, with rule 2's order) hold them all.
        RETURN QUERY
            SELECT u.tid, u.w, u.d
              FROM (SELECT k.token_id AS tid, k.weight AS w, k.distance AS d
                      FROM ht_knn(p_set_id, p_center, p_k, p_radius, false) k
                    UNION ALL
                    SELECT n.tid, n.w, n.d
                      FROM (SELECT n.tid, n.w, n.d
                              FROM (SELECT m.token_id AS tid, m.weight AS w, m.position <<->> p_center AS d
                                      FROM memory_atoms m
                                     WHERE m.atom_set_id = p_set_id
                                     ORDER BY m.position <<->> p_center) n
                             WHERE p_radius IS NULL OR n.d <= p_radius
                             ORDER BY n.d, n.tid, n.w
                             LIMIT p_k) n) u
             ORDER BY u.d, u.tid, u.w
             LIMIT p_k;
        RETURN;
    END IF;
    IF (SELECT s.layout FROM atom_sets s WHERE s.id = p_set_id) IS DISTINCT FROM 'tiles' THEN
    -- The index scan yields the distance order; an incremental sort over it breaks the ties
    -- (it reads ahead up to 31 rows past the k-th). PostgreSQL 15 plans an index scan with
    -- ORDER BY operators only for the whole ORDER BY, hence the subquery, and with
    -- enable_sort = off (this function's setting) so that the generic plan does not sort
    -- the whole partition instead.
    RETURN QUERY
        SELECT n.tid, n.w, n.d
          FROM (SELECT a.token_id AS tid, a.weight AS w, a.position <<->> p_center AS d
                  FROM atoms a
                 WHERE a.atom_set_id = p_set_id
                 ORDER BY a.position <<->> p_center) n
         WHERE p_radius IS NULL OR n.d <= p_radius
         ORDER BY n.d, n.tid, n.w
         LIMIT p_k;
        RETURN;
    END IF;
    -- The tiles layout.
    OPEN tiles;
    LOOP
        FETCH tiles INTO tile;
        EXIT WHEN NOT FOUND OR tile.d > bound OR tile.d > p_radius;
        xs := xs || tile.xs;
        ys := ys || tile.ys;
        zs := zs || tile.zs;
        tids := tids || tile.token_ids;
        ws := ws || tile.weights;
        IF bound IS NULL AND cardinality(tids) >= p_k THEN
            SELECT u.d INTO bound
              FROM (SELECT sqrt(CASE WHEN tiny AND abs(u.dx) < sq0 THEN 0 ELSE u.dx * u.dx END
                                + CASE WHEN tiny AND abs(u.dy) < sq0 THEN 0 ELSE u.dy * u.dy END
                                + CASE WHEN tiny AND abs(u.dz) < sq0 THEN 0 ELSE u.dz * u.dz END) AS d
                      FROM (SELECT u.x - cx AS dx, ys[u.i] - cy AS dy, zs[u.i] - cz AS dz
                              FROM unnest(xs) WITH ORDINALITY AS u(x, i) OFFSET 0) u) u
             ORDER BY u.d OFFSET p_k - 1 LIMIT 1;
        END IF;
    END LOOP;
    CLOSE tiles;
    -- One unnest plus subscripts: a multi-array unnest materialises each array first (slower).
    -- Atoms beyond the bound cannot be among the first p_k, so they skip the sort.
    bound := least(bound, p_radius);
    RETURN QUERY
        SELECT tids[k.i], ws[k.i], k.d
          FROM (SELECT u.i, sqrt(CASE WHEN tiny AND abs(u.dx) < sq0 THEN 0 ELSE u.dx * u.dx END
                                 + CASE WHEN tiny AND abs(u.dy) < sq0 THEN 0 ELSE u.dy * u.dy END
                                 + CASE WHEN tiny AND abs(u.dz) < sq0 THEN 0 ELSE u.dz * u.dz END) AS d
                  FROM (SELECT u.i, u.x - cx AS dx, ys[u.i] - cy AS dy, zs[u.i] - cz AS dz
                          FROM unnest(xs) WITH ORDINALITY AS u(x, i) OFFSET 0) u) k
         WHERE bound IS NULL OR k.d <= bound
         ORDER BY k.d, tids[k.i], ws[k.i]
         LIMIT p_k;
END
$$;


CREATE OR REPLACE FUNCTION ht_knn_arrays(
    p_set_id integer, p_center geometry, p_k integer, p_radius double precision DEFAULT NULL,
    p_memory boolean DEFAULT false, OUT token_ids integer[], OUT weights double precision[], OUT distances double precision[])
LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY INVOKER
SET search_path = public, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
SET enable_sort = off
AS $$
-- ht_knn's rows as three arrays in its order (empty: none), for the native kernel
-- (sql/060_kernel.sql). The rows layout runs ht_knn's own query here, aggregated in place (no
-- set-returning call between: ~0.07 ms less per call); the tiles layout reads ht_knn.
-- tests/test_layouts.py and tests/test_kernel_native.py check both against ht_knn's rows.
DECLARE
    routed record;
BEGIN
    IF ht_routes() THEN  -- a Citus coordinator: the centre's cell alone where that is the whole answer
        SELECT * INTO routed FROM ht_knn_routed(p_set_id, p_center, p_k, p_radius, p_memory);
        IF routed.token_ids IS NOT NULL THEN
            token_ids := routed.token_ids;
            weights := routed.weights;
            distances := routed.distances;
            RETURN;
        END IF;
    END IF;
    IF NOT p_memory AND (SELECT s.layout FROM atom_sets s WHERE s.id = p_set_id) IS DISTINCT FROM 'tiles' THEN
        SELECT coalesce(array_agg(n.tid ORDER BY n.d, n.tid, n.w), '{}'),
               coalesce(array_agg(n.w ORDER BY n.d, n.tid, n.w), '{}'),
               coalesce(array_agg(n.d ORDER BY n.d, n.tid, n.w), '{}')
          INTO token_ids, weights, distances
          FROM (SELECT n.tid, n.w, n.d
                  FROM (SELECT a.token_id AS tid, a.weight AS w, a.position <<->> p_center AS d
                          FROM atoms a
                         WHERE a.atom_set_id = p_set_id
                         ORDER BY a.position <<->> p_center) n
                 WHERE p_radius IS NULL OR n.d <= p_radius
                 ORDER BY n.d, n.tid, n.w
                 LIMIT p_k) n;
        RETURN;
    END IF;
    SELECT coalesce(array_agg(k.token_id ORDER BY k.i), '{}'), coalesce(array_agg(k.weight ORDER BY k.i), '{}'),
           coalesce(array_agg(k.distance ORDER BY k.i), '{}')
      INTO token_ids, weights, distances
      FROM ht_knn(p_set_id, p_center, p_k, p_radius, p_memory) WITH ORDINALITY AS k(token_id, weight, distance, i);
END
$$;
