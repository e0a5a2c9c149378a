/*
 * The KNN and SPI: what the C steps read from the database, as the caller (SECURITY INVOKER): an
 * atom set's row version, its token_blocks and its row, and the KNN (ht_knn's rows) through a
 * prepared plan, routed to one Citus worker where that is exact. Every function here runs inside
 * SPI (the caller connected).
 */
#include "hartonomous_kernel.h"

/* The version of atom set set_id's row and whether its layout is rows; false: no such set. Inside SPI. */
static SPIPlanPtr set_version_plan = NULL;

bool
read_set_version(int32 set_id, SetVersion *v, bool *rows)
{
	Datum		arg = Int32GetDatum(set_id);
	bool		isnull;

	if (set_version_plan == NULL)
	{
		Oid			argtypes[1] = {INT4OID};
		SPIPlanPtr	plan = SPI_prepare("SELECT s.xmin, s.ctid, s.layout IS DISTINCT FROM 'tiles' FROM atom_sets s"
									   " WHERE s.id = $1", 1, argtypes);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "htk: preparing the atom set lookup failed");
		set_version_plan = plan;
	}
	if (SPI_execute_plan(set_version_plan, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "htk: reading atom_sets failed");
	if (SPI_processed != 1)
		return false;
	v->id = set_id;
	v->xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
																&isnull)), &v->ctid);
	*rows = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	return true;
}

/* A bad token_blocks row: a data error naming the set and the block. */
#define BAD_BLOCK(code, ...) ereport(ERROR, (errcode(code), errmsg(__VA_ARGS__), \
	errhint("token_blocks rows are written by the atom set's build; rebuild the set (hartonomous build --replace).")))

/* Read the set's token_blocks into slot (whose set is v): positions, or not served. Inside SPI. */
void
load_positions(PositionCache *slot, const SetVersion *v)
{
	Datum		arg = Int32GetDatum(v->id);
	Oid			argtypes[1] = {INT4OID};
	int32		max_block = -1;
	uint64		bytes;
	SPITupleTable *table;
	uint64		rows;

	if (SPI_execute_with_args("SELECT k.block, k.xs, k.ys, k.zs FROM token_blocks k WHERE k.atom_set_id = $1",
							  1, argtypes, &arg, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "htk: reading token_blocks failed");
	table = SPI_tuptable;
	rows = SPI_processed;
	for (uint64 r = 0; r < rows; r++)
	{
		bool		isnull;
		Datum		b = SPI_getbinval(table->vals[r], table->tupdesc, 1, &isnull);

		CHECK_FOR_INTERRUPTS();
		if (isnull)
			BAD_BLOCK(ERRCODE_NULL_VALUE_NOT_ALLOWED, "token_blocks of atom set %d: a row's block is NULL", v->id);
		if (DatumGetInt32(b) < 0 || DatumGetInt32(b) > MAX_BLOCK)
			BAD_BLOCK(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
					  "token_blocks of atom set %d: block %d is outside 0 .. %d", v->id, DatumGetInt32(b), MAX_BLOCK);
		max_block = Max(max_block, DatumGetInt32(b));
	}
	if (max_block < 0)
		return;					/* no token_blocks: the SQL path reads the tokens table */
	bytes = (uint64) (max_block + 1) * TOKEN_BLOCK * 3 * sizeof(double);	/* <= 6.4e9: no overflow */
	if (bytes > MaxAllocSize || bytes > state_limit())
	{
		slot->refused_kb = max_state_kb;	/* too large to keep: the SQL path serves it */
		return;
	}
	trim_kept(state_limit() - bytes, NULL, NULL);
	slot->slots = (max_block + 1) * TOKEN_BLOCK;
	slot->xyz = MemoryContextAlloc(TopMemoryContext, bytes);
	for (int i = 0; i < 3 * slot->slots; i++)
		slot->xyz[i] = get_float8_nan();
	for (uint64 r = 0; r < rows; r++)
	{
		bool		isnull;
		HeapTuple	tup = table->vals[r];
		int32		b = DatumGetInt32(SPI_getbinval(tup, table->tupdesc, 1, &isnull));

		CHECK_FOR_INTERRUPTS();
		for (int a = 0; a < 3; a++)
		{
			static const char *const axes[] = {"xs", "ys", "zs"};
			Datum		d = SPI_getbinval(tup, table->tupdesc, 2 + a, &isnull);
			ArrayType  *arr;
			double	   *p;

			if (isnull)
				BAD_BLOCK(ERRCODE_NULL_VALUE_NOT_ALLOWED, "token_blocks of atom set %d: block %d has NULL %s",
						  v->id, b, axes[a]);
			arr = DatumGetArrayTypeP(d);
			if (ARR_ELEMTYPE(arr) != FLOAT8OID || ARR_NDIM(arr) != 1 || ARR_DIMS(arr)[0] != TOKEN_BLOCK
				|| (ARR_HASNULL(arr) && array_contains_nulls(arr)))
				BAD_BLOCK(ERRCODE_ARRAY_SUBSCRIPT_ERROR,
						  "token_blocks of atom set %d: block %d's %s must be %d numbers without NULL",
						  v->id, b, axes[a], TOKEN_BLOCK);
			p = (double *) ARR_DATA_PTR(arr);
			for (int j = 0; j < TOKEN_BLOCK; j++)
			{
				if (isinf(p[j]))
					BAD_BLOCK(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
							  "token_blocks of atom set %d: block %d's %s must be finite or NaN (no token), got %s",
							  v->id, b, axes[a], float8out_internal(p[j]));
				slot->xyz[3 * ((int64) b * TOKEN_BLOCK + j) + a] = p[j];
			}
		}
	}
	for (int i = 0; i < slot->slots; i++)
	{
		const double *p = slot->xyz + 3 * i;

		if (isnan(p[0]) != isnan(p[1]) || isnan(p[0]) != isnan(p[2]))
			BAD_BLOCK(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
					  "token_blocks of atom set %d: token %d has NaN in some coordinates only", v->id, i);
	}
	slot->served = true;
}

/*
 * The KNN of ht_knn's rows layout: the k atoms nearest to the centre within the radius, ties in
 * distance broken by token id, then weight (ht_knn, sql/015_knn.sql). Read in the index's own order
 * (the bare KNN's plan, which computes the distance anyway) with FETCH FIRST k ROWS WITH TIES: the
 * first k rows and every row at the k-th one's distance. The rows within the radius are a prefix of
 * that order; where more than k are left (a tie across the k-th row: atoms at one key are common in
 * real sets), ht_knn's order (distance, token id, weight) picks which of the tie are in, here in C.
 * Prepared once per session as a generic plan (the partition is pruned at executor start-up) and
 * run with enable_sort = off, as ht_knn does, so a re-plan keeps the index scan. Called inside SPI;
 * the arrays are allocated in the caller's context.
 */
static SPIPlanPtr knn_plan = NULL;
uint64		knn_boundary_ties = 0;

typedef struct
{
	int32		tid;
	double		w;
	double		d;
} KnnRow;

static int
knn_row_order(const void *a, const void *b)
{
	const KnnRow *x = a, *y = b;

	if (x->d != y->d)
		return x->d < y->d ? -1 : 1;
	if (x->tid != y->tid)
		return x->tid < y->tid ? -1 : 1;
	return (x->w > y->w) - (x->w < y->w);
}

/*
 * The KNN's rows go straight into arrays as the executor produces them (a DestReceiver), rather
 * than through SPI's tuple table, which copies every tuple; rows beyond the radius are dropped.
 */
typedef struct
{
	DestReceiver pub;
	bool		has_radius;
	double		radius;
	int			n, cap;
	int32	   *ids;
	double	   *ws, *ds;
} KnnReceiver;

static bool
knn_receive(TupleTableSlot *slot, DestReceiver *self)
{
	KnnReceiver *r = (KnnReceiver *) self;
	bool		isnull;
	double		d = DatumGetFloat8(slot_getattr(slot, 3, &isnull));

	if (r->has_radius && !(d <= r->radius))
		return true;
	if (r->n == r->cap)
	{
		r->cap *= 2;
		r->ids = repalloc(r->ids, sizeof(int32) * r->cap);
		r->ws = repalloc(r->ws, sizeof(double) * r->cap);
		r->ds = repalloc(r->ds, sizeof(double) * r->cap);
	}
	r->ids[r->n] = DatumGetInt32(slot_getattr(slot, 1, &isnull));
	r->ws[r->n] = DatumGetFloat8(slot_getattr(slot, 2, &isnull));
	r->ds[r->n] = d;
	r->n++;
	return true;
}

static void
knn_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
}

static void
knn_shutdown(DestReceiver *self)
{
}

static void
knn_destroy(DestReceiver *self)
{
}

/* A KNN plan (prepared once per session as a generic plan) of these parameter types. */
static SPIPlanPtr
knn_prepare(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL)
		elog(ERROR, "htk: preparing the KNN failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "htk: keeping the KNN plan failed");
	return plan;
}

/* Run a KNN plan (its rows: token id, weight, distance) into arrays, ht_knn's tie rule at the k-th row. */
static void
knn_execute(SPIPlanPtr plan, ParamListInfo params, int k, bool has_radius, double radius,
			int32 **ids, double **ws, double **ds, int *n)
{
	KnnReceiver receiver;
	SPIExecuteOptions options;

	memset(&receiver, 0, sizeof(receiver));
	receiver.pub.receiveSlot = knn_receive;
	receiver.pub.rStartup = knn_startup;
	receiver.pub.rShutdown = knn_shutdown;
	receiver.pub.rDestroy = knn_destroy;
	receiver.pub.mydest = DestNone;
	receiver.has_radius = has_radius;
	receiver.radius = radius;
	receiver.cap = Min(k + 1, 1024);	/* grows as rows come */
	receiver.ids = SPI_palloc(sizeof(int32) * receiver.cap);	/* the caller's context */
	receiver.ws = SPI_palloc(sizeof(double) * receiver.cap);
	receiver.ds = SPI_palloc(sizeof(double) * receiver.cap);
	memset(&options, 0, sizeof(options));
	options.params = params;
	options.read_only = true;
	options.dest = (DestReceiver *) &receiver;
	if (SPI_execute_plan_extended(plan, &options) < 0)	/* SPI_OK_UTILITY: rows went to the receiver */
		elog(ERROR, "htk: the KNN failed");
	*ids = receiver.ids;
	*ws = receiver.ws;
	*ds = receiver.ds;
	*n = receiver.n;
	if (*n > k)
	{
		KnnRow	   *rows = palloc(sizeof(KnnRow) * *n);

		knn_boundary_ties++;
		for (int i = 0; i < *n; i++)
		{
			rows[i].tid = (*ids)[i];
			rows[i].w = (*ws)[i];
			rows[i].d = (*ds)[i];
		}
		checked_sort(rows, *n, sizeof(KnnRow), knn_row_order);
		for (int i = 0; i < k; i++)
		{
			(*ids)[i] = rows[i].tid;
			(*ws)[i] = rows[i].w;
			(*ds)[i] = rows[i].d;
		}
		*n = k;
	}
}

/*
 * The KNN's centre as one geometry parameter: ST_MakePoint(x, y, z) called once per KNN, here,
 * rather than in the query, where the index scan's recheck and the select list each evaluated it
 * again for every row they read (the same function, so the same point and the same distances).
 * The type and the function are looked up once per session, as the query's names were.
 */
static Oid	knn_geometry = InvalidOid;
static FmgrInfo knn_make_point;

static void
knn_point_init(void)
{
	bool		isnull;
	Oid			make_point;

	if (SPI_execute("SELECT 'geometry'::regtype::oid,"
					" 'st_makepoint(double precision, double precision, double precision)'::regprocedure::oid",
					true, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "htk: looking up geometry and ST_MakePoint failed");
	knn_geometry = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	make_point = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	fmgr_info_cxt(make_point, &knn_make_point, TopMemoryContext);
}

static Datum
knn_point(const double *center)
{
	return FunctionCall3(&knn_make_point, Float8GetDatum(center[0]), Float8GetDatum(center[1]),
						 Float8GetDatum(center[2]));
}

static ParamListInfo
knn_params(int n, const Oid *types, const Datum *values)
{
	ParamListInfo params = makeParamList(n);

	for (int i = 0; i < n; i++)
	{
		params->params[i].value = values[i];
		params->params[i].isnull = false;
		params->params[i].pflags = PARAM_FLAG_CONST;
		params->params[i].ptype = types[i];
	}
	return params;
}

/*
 * Routing on Citus (sql/015_knn.sql has the rule and why it is exact; this is the same rule). Where
 * ht_routes() is true (sql/ installed on a Citus coordinator) and the set routes
 * (atom_sets.route_spread), the KNN first reads the centre's lattice cell alone, a router query to
 * one worker, and keeps that answer where it is provably the fan-out's; otherwise it fans out. The
 * decisions are counted in the session's hartonomous.knn_routed / knn_fanned_out (knn_routing()).
 */
#define ROUTE_OFFSET ((int64) 1 << 20)
#define ROUTE_MARGIN 1e-9		/* sep is compared with this much to spare for rounding */
#define ROUTE_CACHE 16

typedef struct
{
	int32		set_id;
	SetVersion	version;		/* the atom_sets row read: a set rebuilt under the same id is read again */
	bool		routes;
	double		spread;
	bool		backoff;
	double		bandwidth;
	double		decay;
} RouteInfo;

static int	routing_state = -1;	/* ht_routes() in this session: -1 not read yet */
static RouteInfo route_cache[ROUTE_CACHE];
static uint32 route_cached = 0;	/* entries in use, at most ROUTE_CACHE */
static uint32 route_next = 0;	/* the entry a new set takes: round robin, always < ROUTE_CACHE */
static SPIPlanPtr knn_cell_plan = NULL;

static bool
routing_on(void)
{
	if (routing_state < 0)
	{
		bool		isnull;

		/* sql/ of a revision before 0018 has no ht_routes(): look it up before calling it */
		if (SPI_execute("SELECT to_regprocedure('ht_routes()') IS NOT NULL", true, 1) != SPI_OK_SELECT
			|| SPI_processed != 1)
			elog(ERROR, "htk: looking up ht_routes() failed");
		routing_state = 0;
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) && !isnull)
		{
			if (SPI_execute("SELECT ht_routes()", true, 1) != SPI_OK_SELECT || SPI_processed != 1)
				elog(ERROR, "htk: reading ht_routes() failed");
			routing_state = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull))
				&& !isnull ? 1 : 0;
		}
	}
	return routing_state == 1;
}

static const RouteInfo *
route_info(int32 set_id)
{
	Oid			argtypes[1] = {INT4OID};
	Datum		arg = Int32GetDatum(set_id);
	RouteInfo  *r = NULL;
	const SetVersion *current = NULL;
	bool		isnull;
	Datum		spread;

	/* the callers read the set's version into the position cache just before (cached_set) */
	current = cached_version(set_id);
	for (uint32 i = 0; i < route_cached; i++)
		if (route_cache[i].set_id == set_id)
		{
			if (current != NULL && same_version(&route_cache[i].version, current))
				return &route_cache[i];
			r = &route_cache[i];	/* another version of the set, or none known: read it again */
		}
	if (r == NULL)
	{
		r = &route_cache[route_next];
		route_next = (route_next + 1) % ROUTE_CACHE;
		route_cached = Min(route_cached + 1, ROUTE_CACHE);
	}
	memset(r, 0, sizeof(*r));
	if (SPI_execute_with_args("SELECT s.route_spread, s.kernel = 'backoff', s.bandwidth, s.centroid_decay,"
							  " s.xmin, s.ctid FROM atom_sets s WHERE s.id = $1",
							  1, argtypes, &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "htk: reading atom_sets failed");
	if (SPI_processed == 1)
	{
		HeapTuple	row = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;

		spread = SPI_getbinval(row, desc, 1, &isnull);
		r->routes = !isnull;
		r->spread = isnull ? 0.0 : DatumGetFloat8(spread);
		r->backoff = DatumGetBool(SPI_getbinval(row, desc, 2, &isnull));
		r->bandwidth = DatumGetFloat8(SPI_getbinval(row, desc, 3, &isnull));
		r->decay = DatumGetFloat8(SPI_getbinval(row, desc, 4, &isnull));
		r->version.id = set_id;
		r->version.xmin = DatumGetTransactionId(SPI_getbinval(row, desc, 5, &isnull));
		ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 6, &isnull)), &r->version.ctid);
	}
	r->set_id = set_id;
	return r;
}

static void
count_knn(bool routed)
{
	const char *name = routed ? "hartonomous.knn_routed" : "hartonomous.knn_fanned_out";
	const char *now;
	char		next[32];

	if (IsInParallelMode())		/* settings cannot change there: the decision stands, uncounted */
		return;
	now = GetConfigOption(name, true, false);

	snprintf(next, sizeof(next), INT64_FORMAT, (int64) ((now != NULL && *now != '\0' ? strtoll(now, NULL, 10) : 0) + 1));
	SetConfigOption(name, next, PGC_USERSET, PGC_S_SESSION);
}

/* ht_knn's rows (the k nearest stored atoms of the set to the centre), routed where that is exact. */
void
knn_rows(int32 set_id, const double *center, int k, bool has_radius, double radius,
		 int32 **ids, double **ws, double **ds, int *n)
{
	if (routing_on())
	{
		const RouteInfo *r = route_info(set_id);

		if (r->routes && fmax(fabs(center[0]), fmax(fabs(center[1]), fabs(center[2]))) < ROUTE_OFFSET - 1)
		{
			Oid			types[12] = {INT4OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, INT4OID, INT8OID,
									 FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID, FLOAT8OID};
			double		c[3] = {rint(center[0]), rint(center[1]), rint(center[2])};
			double		sep = 1.0 - r->spread - fmax(fabs(center[0] - c[0]),
													 fmax(fabs(center[1] - c[1]), fabs(center[2] - c[2])));
			int64		cell = (((int64) c[0] + ROUTE_OFFSET) << 42) + (((int64) c[1] + ROUTE_OFFSET) << 21)
				+ ((int64) c[2] + ROUTE_OFFSET);
			Datum		values[12] = {Int32GetDatum(set_id), Float8GetDatum(center[0]), Float8GetDatum(center[1]),
									  Float8GetDatum(center[2]), Int32GetDatum(k), Int64GetDatum(cell),
									  Float8GetDatum(c[0] - 0.5), Float8GetDatum(c[1] - 0.5),
									  Float8GetDatum(c[2] - 0.5), Float8GetDatum(c[0] + 0.5),
									  Float8GetDatum(c[1] + 0.5), Float8GetDatum(c[2] + 0.5)};

			if (knn_cell_plan == NULL)
				knn_cell_plan = knn_prepare(
					"SELECT a.token_id, a.weight, a.position <<->> ST_MakePoint($2, $3, $4)"
					"  FROM atoms a WHERE a.atom_set_id = $1 AND a.route = $6"
					"   AND a.position &&& ST_MakeLine(ST_MakePoint($7, $8, $9), ST_MakePoint($10, $11, $12))"
					" ORDER BY a.position <<->> ST_MakePoint($2, $3, $4) FETCH FIRST $5 ROWS WITH TIES",
					12, types);
			knn_execute(knn_cell_plan, knn_params(12, types, values), k, has_radius, radius, ids, ws, ds, n);
			sep -= ROUTE_MARGIN;
			if ((has_radius && radius < sep) || (*n >= k && (*ds)[k - 1] < sep)
				|| (r->backoff && *n > 0 && backoff_radius((*ds)[0], r->bandwidth, r->decay) < sep))
			{
				count_knn(true);
				return;
			}
			count_knn(false);
		}
	}
	{
		Oid			types[3] = {INT4OID, InvalidOid, INT4OID};
		Datum		values[3];

		if (knn_plan == NULL)
		{
			knn_point_init();
			types[1] = knn_geometry;
			knn_plan = knn_prepare("SELECT a.token_id, a.weight, a.position <<->> $2"
								   "  FROM atoms a WHERE a.atom_set_id = $1"
								   " ORDER BY a.position <<->> $2 FETCH FIRST $3 ROWS WITH TIES",
								   3, types);
		}
		types[1] = knn_geometry;
		values[0] = Int32GetDatum(set_id);
		values[1] = knn_point(center);
		values[2] = Int32GetDatum(k);
		knn_execute(knn_plan, knn_params(3, types, values), k, has_radius, radius, ids, ws, ds, n);
	}
}

/* The atom set lookups of htk_step and htk_store_step (read_set_row). */
static SPIPlanPtr set_by_name_plan = NULL;
static SPIPlanPtr default_set_plan = NULL;

/*
 * The 8th column: whether the set's kernel is the backoff kernel (next_token's C step has all
 * three); then the row's version and whether its layout is rows (cached_set's).
 */
#define SET_COLUMNS "SELECT s.id, s.centroid_window, s.centroid_decay, s.kernel = 'gaussian', s.bandwidth," \
	" s.history_weight, s.history_window, s.kernel = 'backoff', s.xmin, s.ctid," \
	" s.layout IS DISTINCT FROM 'tiles' FROM atom_sets s"

/*
 * The atom set named by argument `name_arg` of fcinfo (NULL: the default one), as ht_atom_set reads
 * it; false where there is not exactly one. Inside SPI.
 */
bool
read_set_row(FunctionCallInfo fcinfo, int name_arg, SetRow *s)
{
	HeapTuple	row;
	TupleDesc	desc;
	Datum		arg;
	bool		isnull, gaussian, backoff;

	if (PG_ARGISNULL(name_arg))
	{
		if (default_set_plan == NULL)
		{
			SPIPlanPtr	plan = SPI_prepare(SET_COLUMNS " WHERE s.is_default", 0, NULL);

			if (plan == NULL || SPI_keepplan(plan) != 0)
				elog(ERROR, "htk: preparing the atom set lookup failed");
			default_set_plan = plan;
		}
		if (SPI_execute_plan(default_set_plan, NULL, NULL, true, 2) != SPI_OK_SELECT)
			elog(ERROR, "htk: reading atom_sets failed");
	}
	else
	{
		Oid			argtypes[1] = {TEXTOID};

		if (set_by_name_plan == NULL)
		{
			SPIPlanPtr	plan = SPI_prepare(SET_COLUMNS " WHERE s.name = $1", 1, argtypes);

			if (plan == NULL || SPI_keepplan(plan) != 0)
				elog(ERROR, "htk: preparing the atom set lookup failed");
			set_by_name_plan = plan;
		}
		arg = PG_GETARG_DATUM(name_arg);
		if (SPI_execute_plan(set_by_name_plan, &arg, NULL, true, 2) != SPI_OK_SELECT)
			elog(ERROR, "htk: reading atom_sets failed");
	}
	if (SPI_processed != 1)
		return false;
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	s->version.id = DatumGetInt32(SPI_getbinval(row, desc, 1, &isnull));
	arg = SPI_getbinval(row, desc, 2, &isnull);	/* centroid_window: NULL is no window */
	s->has_window = !isnull;
	s->window = isnull ? 0 : DatumGetInt32(arg);
	s->decay = DatumGetFloat8(SPI_getbinval(row, desc, 3, &isnull));
	gaussian = DatumGetBool(SPI_getbinval(row, desc, 4, &isnull));
	s->bandwidth = DatumGetFloat8(SPI_getbinval(row, desc, 5, &isnull));
	s->history_weight = DatumGetFloat8(SPI_getbinval(row, desc, 6, &isnull));
	s->history = DatumGetInt32(SPI_getbinval(row, desc, 7, &isnull));
	backoff = DatumGetBool(SPI_getbinval(row, desc, 8, &isnull));
	s->version.xmin = DatumGetTransactionId(SPI_getbinval(row, desc, 9, &isnull));
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 10, &isnull)), &s->version.ctid);
	s->rows = DatumGetBool(SPI_getbinval(row, desc, 11, &isnull));
	s->kernel = backoff ? KERNEL_BACKOFF : gaussian ? KERNEL_GAUSSIAN : KERNEL_EXPONENTIAL;
	return true;
}
