/*
 * hartonomous_kernel: next_token's hot loop in C, each function the C form of a PL/pgSQL reference
 * in sql/ that defines its semantics (results agree with it to rounding: sums may run in another
 * order).
 *
 * Pure functions over arrays (no table access):
 *   htk_keys          context centroid and history keys from positions (sql/010_context_centroid.sql):
 *                     3 * (1 + m) numbers, the centre, then key k = the centroid of elements
 *                     1 .. n - m + k - 1, m = min(history_window, n - 1)
 *   htk_distribution  kernel terms, per-token log-sum-exp, the shared sampler (sql/020_next_token.sql)
 *   htk_logits        raw logits and next_token_signals' signals from the same terms (sql/050_signals.sql)
 *   htk_store         the kernel's own distribution and store_distribution's features, every
 *                     candidate counted, memory atoms flagged (from 1.4; sql/090_store.sql)
 *
 * Every kernel of atom_sets.kernel is served: gaussian, exponential and backoff (the radius ladder of
 * ht_backoff_radius; no pruning, as its radius depends on the nearest candidate), taken by name
 * (kernel text, with centroid_decay for the backoff ladder). One version is served, 1.5 (the
 * cut, migration 0019): the C symbols of htk_distribution, htk_logits, htk_next_token and
 * htk_step_logits keep the _1_3 suffix of the signatures they were first declared with, and the
 * unsuffixed symbols of the 1.0-1.2 `gaussian boolean` signatures are gone, so a database still
 * declaring those gets "could not find function" rather than a call with the wrong arguments.
 *   htk_pick          the pick rule of every draw (ht_pick, sql/030_sampling.sql)
 * Whole steps, reading the atom set through SPI (as the caller: SECURITY INVOKER):
 *   htk_serves        whether the steps below serve a set (rows layout, with token_blocks)
 *   htk_next_token    one next_token step for a set's own parameters (the loops, sql/060_kernel.sql)
 *   htk_step          next_token with its own arguments; NULL for anything it does not serve
 *   htk_step_logits   htk_logits for a context, with the backend's state
 *   htk_store_step    store_distribution without memory, with its own arguments and the backend's
 *                     state; no rows for anything it does not serve (from 1.4)
 *   htk_stats         this backend's counters and the memory it keeps
 *
 * Every entry point is executable by any role that may run next_token, so each checks its own
 * arguments: SQLSTATE 22023 naming the argument, in the SQL functions' words (htk_step returns NULL
 * instead, so that next_token's checked path raises). Loops over input check for interrupts.
 *
 * Backend state (TopMemoryContext): the token positions of up to CACHE_SETS atom sets and the keys
 * of up to STATE_SLOTS contexts, keyed by the atom_sets row's version (xmin, ctid), so a set
 * rebuilt under a reused id is read again. Together they stay within
 * hartonomous_kernel.max_state_memory after every call (least recently used dropped first); a
 * context or set larger than that alone is not kept. A bad token_blocks row raises a data error
 * (22004, 22003, 2202E), never corrupts memory.
 *
 * This file holds the entry points; the kernel arithmetic, the KNN and SPI, and the per-backend
 * state are arithmetic.c, knn.c and state.c (hartonomous_kernel.h says what each holds).
 */
#include "hartonomous_kernel.h"

PG_MODULE_MAGIC;

PG_FUNCTION_INFO_V1(htk_keys);
PG_FUNCTION_INFO_V1(htk_pick);
PG_FUNCTION_INFO_V1(htk_serves);
PG_FUNCTION_INFO_V1(htk_step);
PG_FUNCTION_INFO_V1(htk_stats);
PG_FUNCTION_INFO_V1(htk_distribution_1_3);
PG_FUNCTION_INFO_V1(htk_logits_1_3);
PG_FUNCTION_INFO_V1(htk_next_token_1_3);
PG_FUNCTION_INFO_V1(htk_step_logits_1_3);
PG_FUNCTION_INFO_V1(htk_store);
PG_FUNCTION_INFO_V1(htk_store_step);

/* ---------------------------------------------------------------------------------------- */
/* Arguments: each entry point checks its own (SQLSTATE 22023 naming the argument)          */
/* ---------------------------------------------------------------------------------------- */

static void
require_args(FunctionCallInfo fcinfo, const char *const *names)
{
	for (int i = 0; names[i] != NULL; i++)
		if (names[i][0] != '\0' && PG_ARGISNULL(i))
			BAD_ARG("%s must not be NULL", names[i]);
}

static void
check_between(const char *name, int v, int lo, int hi)
{
	if (v < lo || v > hi)
		BAD_ARG("%s must be between %d and %d, got %d", name, lo, hi, v);
}

static void
check_positive(const char *name, double v)
{
	if (!(v > 0.0 && isfinite(v)))
		BAD_ARG("%s must be a finite number > 0, got %s", name, float8out_internal(v));
}

static void
check_nonnegative(const char *name, double v)
{
	if (!(v >= 0.0 && isfinite(v)))
		BAD_ARG("%s must be a finite number >= 0, got %s", name, float8out_internal(v));
}

static void
check_decay(double decay)
{
	if (!(decay > 0.0 && decay <= 1.0))
		BAD_ARG("centroid_decay must be in (0, 1], got %s", float8out_internal(decay));
}

static void
check_window(bool has_window, int window)
{
	if (has_window && window < 1)
		BAD_ARG("centroid_window must be >= 1 or NULL, got %d", window);
}

/* next_token's sampler arguments; has_*: not NULL. */
static void
check_sampler(double temperature, bool has_top_k, int top_k, bool has_top_p, double top_p,
			  double penalty)
{
	if (!(temperature >= 0.0 && isfinite(temperature)))
		BAD_ARG("temperature must be a finite number >= 0, got %s", float8out_internal(temperature));
	if (temperature > 0.0 && (temperature < 1e-6 || temperature > 1e6))
		BAD_ARG("temperature must be 0 or between 1e-06 and 1e+06, got %s", float8out_internal(temperature));
	if (has_top_k && top_k < 0)
		BAD_ARG("top_k must be >= 0, got %d", top_k);
	if (has_top_p && !(top_p > 0.0 && top_p <= 1.0))
		BAD_ARG("top_p must be in (0, 1], got %s", float8out_internal(top_p));
	check_positive("repetition_penalty", penalty);
	if (penalty < 1e-6 || penalty > 1e6)
		BAD_ARG("repetition_penalty must be between 1e-06 and 1e+06, got %s", float8out_internal(penalty));
}

static void
check_radius(bool has_radius, double radius)
{
	if (has_radius && !(radius >= 0.0))
		BAD_ARG("search_radius must be >= 0, got %s", float8out_internal(radius));
}

/* The kernel argument of the 1.3 signatures (not NULL: the caller checked): its name. */
static Kernel
kernel_arg(text *name)
{
	char	   *s = text_to_cstring(name);

	if (strcmp(s, "gaussian") == 0)
		return KERNEL_GAUSSIAN;
	if (strcmp(s, "exponential") == 0)
		return KERNEL_EXPONENTIAL;
	if (strcmp(s, "backoff") == 0)
		return KERNEL_BACKOFF;
	BAD_ARG("kernel must be 'gaussian', 'exponential' or 'backoff', got %s", quote_literal_cstr(s));
	return KERNEL_GAUSSIAN;		/* not reached */
}

/* The backoff kernel's ladder needs a contraction: centroid_decay < 1 (atom_sets' own rule). */
static void
check_backoff_decay(Kernel kernel, double decay)
{
	if (kernel == KERNEL_BACKOFF && !(decay < 1.0))
		BAD_ARG("centroid_decay must be below 1 for the backoff kernel, got %s", float8out_internal(decay));
}

/* A one-dimensional array of element type `type` without NULLs: its data and its length. */
static void *
array_items(ArrayType *a, Oid type, int *n, const char *name)
{
	if (ARR_ELEMTYPE(a) != type)
		BAD_ARG("%s must be an array of %s", name, format_type_be(type));
	if (ARR_NDIM(a) > 1)
		BAD_ARG("%s must be a one-dimensional array, got %d dimensions", name, ARR_NDIM(a));
	if (ARR_HASNULL(a) && array_contains_nulls(a))
		BAD_ARG("%s must not contain NULL", name);
	*n = ARR_NDIM(a) == 0 ? 0 : ARR_DIMS(a)[0];
	return ARR_DATA_PTR(a);
}

#define float8_items(a, n, name) ((double *) array_items((a), FLOAT8OID, (n), (name)))
#define int4_items(a, n, name) ((int32 *) array_items((a), INT4OID, (n), (name)))

/* Every element finite, and with `rule` "> 0" or ">= 0" that too ("": any finite number). */
static void
check_finite_items(const double *v, int n, const char *name, const char *rule)
{
	bool		positive = strcmp(rule, "> 0") == 0, nonnegative = strcmp(rule, ">= 0") == 0;

	for (int i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!isfinite(v[i]) || (positive && !(v[i] > 0.0)) || (nonnegative && !(v[i] >= 0.0)))
			BAD_ARG("%s must hold finite numbers%s%s, got %s (element %d)", name, rule[0] ? " " : "", rule,
					float8out_internal(v[i]), i + 1);
	}
}

/* A context: a non-empty one-dimensional array of token ids without NULLs (ht_check_context). */
static int32 *
context_items(ArrayType *a, int *n)
{
	if (ARR_NDIM(a) == 0)
		BAD_ARG("context must be a non-empty array of token ids, got {}");
	if (ARR_NDIM(a) != 1)
		BAD_ARG("context must be a one-dimensional array of token ids, got %d dimensions", ARR_NDIM(a));
	if (ARR_HASNULL(a))
	{
		bits8	   *bitmap = ARR_NULLBITMAP(a);

		for (int i = 0; i < ARR_DIMS(a)[0]; i++)
			if (!(bitmap[i / 8] & (1 << (i % 8))))
				BAD_ARG("context must not contain NULL (element %d is NULL)", i + 1);
	}
	return int4_items(a, n, "context");
}

/* ---------------------------------------------------------------------------------------- */
/* The functions over arrays: htk_keys, htk_distribution, htk_logits, htk_store             */
/* ---------------------------------------------------------------------------------------- */

Datum
htk_keys(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"positions", "", "centroid_decay", "", NULL};
	int			n3, m;
	double	   *xyz, *out;
	bool		has_window = !PG_ARGISNULL(1);
	int			window = has_window ? PG_GETARG_INT32(1) : 0;
	double		decay;
	int			history = PG_ARGISNULL(3) ? 0 : PG_GETARG_INT32(3);

	require_args(fcinfo, args);
	xyz = float8_items(PG_GETARG_ARRAYTYPE_P(0), &n3, "positions");
	if (n3 == 0 || n3 % 3 != 0)
		BAD_ARG("positions must hold x, y, z of one or more tokens, got %d numbers", n3);
	check_finite_items(xyz, n3, "positions", "");
	check_window(has_window, window);
	decay = PG_GETARG_FLOAT8(2);
	check_decay(decay);
	check_between("history_window", history, 0, MAX_HISTORY_WINDOW);
	out = compute_keys(xyz, n3 / 3, has_window, window, decay, history, &m);
	PG_RETURN_ARRAYTYPE_P(float8_array(out, 3 * (1 + m)));
}

/*
 * The arrays htk_distribution and htk_logits share, arguments 0-4: the context, its keys (htk_keys'
 * layout: the centre, then m history keys) and the KNN rows, checked.
 */
typedef struct
{
	int32	   *ctx;
	int			n_ctx;
	double	   *keys;
	int			m;
	int32	   *knn_ids;
	double	   *knn_w;
	double	   *knn_d;
	int			n_knn;
} StepArrays;

static void
step_arrays(FunctionCallInfo fcinfo, StepArrays *a)
{
	int			n_keys, n_w, n_d;

	a->ctx = context_items(PG_GETARG_ARRAYTYPE_P(0), &a->n_ctx);
	a->keys = float8_items(PG_GETARG_ARRAYTYPE_P(1), &n_keys, "keys");
	a->knn_ids = int4_items(PG_GETARG_ARRAYTYPE_P(2), &a->n_knn, "knn_token_ids");
	a->knn_w = float8_items(PG_GETARG_ARRAYTYPE_P(3), &n_w, "knn_weights");
	a->knn_d = float8_items(PG_GETARG_ARRAYTYPE_P(4), &n_d, "knn_distances");
	if (n_keys < 3 || n_keys % 3 != 0 || n_keys / 3 - 1 > MAX_HISTORY_WINDOW)
		BAD_ARG("keys must hold 3 * (1 + m) numbers, m between 0 and %d, got %d numbers",
				MAX_HISTORY_WINDOW, n_keys);
	a->m = n_keys / 3 - 1;
	if (a->m > a->n_ctx - 1 && a->m > 0)
		BAD_ARG("keys must hold at most one history key per context element before the last, got %d for %d elements",
				a->m, a->n_ctx);
	check_finite_items(a->keys, n_keys, "keys", "");
	if (a->n_knn > MAX_NEIGHBORS)
		BAD_ARG("knn_token_ids must hold at most %d rows (max_neighbors' bound), got %d", MAX_NEIGHBORS, a->n_knn);
	if (n_w != a->n_knn)
		BAD_ARG("knn_weights must be as long as knn_token_ids (%d), got %d", a->n_knn, n_w);
	if (n_d != a->n_knn)
		BAD_ARG("knn_distances must be as long as knn_token_ids (%d), got %d", a->n_knn, n_d);
	check_finite_items(a->knn_w, n_w, "knn_weights", "> 0");
	check_finite_items(a->knn_d, n_d, "knn_distances", ">= 0");
}

/*
 * The kernel and its parameters of htk_distribution and htk_logits, arguments 5-7 (kernel text,
 * bandwidth, centroid_decay), checked; returns the index of the argument after them (history_weight).
 */
static int
kernel_args(FunctionCallInfo fcinfo, Kernel *kernel, double *bandwidth, double *decay)
{
	*kernel = kernel_arg(PG_GETARG_TEXT_PP(5));
	*bandwidth = PG_GETARG_FLOAT8(6);
	check_positive("bandwidth", *bandwidth);
	*decay = PG_GETARG_FLOAT8(7);
	check_decay(*decay);
	check_backoff_decay(*kernel, *decay);
	return 8;
}

/* htk_distribution(context, keys, knn_token_ids, knn_weights, knn_distances, kernel, bandwidth,
 * centroid_decay, history_weight, temperature, top_k, top_p, search_radius, repetition_penalty). */
Datum
htk_distribution_1_3(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"context", "keys", "knn_token_ids", "knn_weights", "knn_distances",
		"kernel", "bandwidth", "centroid_decay", "", "temperature", "", "", "", "repetition_penalty", NULL};
	StepArrays	a;
	Kernel		kernel;
	double		bandwidth, decay, history_weight, temperature, top_p, radius, penalty;
	bool		has_top_k, has_top_p, has_radius;
	int			top_k, i;

	require_args(fcinfo, args);
	step_arrays(fcinfo, &a);
	i = kernel_args(fcinfo, &kernel, &bandwidth, &decay);
	history_weight = PG_ARGISNULL(i) ? 0.0 : PG_GETARG_FLOAT8(i);
	check_nonnegative("history_weight", history_weight);
	temperature = PG_GETARG_FLOAT8(i + 1);
	has_top_k = !PG_ARGISNULL(i + 2);
	top_k = has_top_k ? PG_GETARG_INT32(i + 2) : 0;
	has_top_p = !PG_ARGISNULL(i + 3);
	top_p = has_top_p ? PG_GETARG_FLOAT8(i + 3) : 1.0;
	has_radius = !PG_ARGISNULL(i + 4);
	radius = has_radius ? PG_GETARG_FLOAT8(i + 4) : 0.0;
	penalty = PG_GETARG_FLOAT8(i + 5);
	check_sampler(temperature, has_top_k, top_k, has_top_p, top_p, penalty);
	check_radius(has_radius, radius);

	PG_RETURN_DATUM(rows_record(fcinfo, a.ctx, a.n_ctx, a.keys, a.m, a.knn_ids, a.knn_w, a.knn_d, a.n_knn,
								kernel, bandwidth, decay, history_weight, has_radius, radius, temperature,
								has_top_k, top_k, has_top_p, top_p, penalty));
}

/*
 * One step's raw token logits (per-token log-sum-exp of the kernel terms: before the repetition
 * penalty, temperature, top-k and top-p, which the caller applies with the shared sampler) and the
 * step's signals, from the same candidates (next_token_signals, sql/050_signals.sql): so a caller
 * that needs both pays for one KNN and one pass. The KNN rows come without search_radius (the
 * nearest stored atom is measured before it); the radius is applied here, as next_token does.
 * Columns: token_ids (ascending), logits, then next_token_signals' first eleven. Arguments: context,
 * keys, knn_token_ids, knn_weights, knn_distances, kernel, bandwidth, centroid_decay, history_weight,
 * search_radius.
 */
Datum
htk_logits_1_3(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"context", "keys", "knn_token_ids", "knn_weights", "knn_distances",
		"kernel", "bandwidth", "centroid_decay", "", "", NULL};
	StepArrays	a;
	Kernel		kernel;
	bool		has_radius;
	double		bandwidth, decay, history_weight, radius;
	int			i;

	require_args(fcinfo, args);
	step_arrays(fcinfo, &a);
	i = kernel_args(fcinfo, &kernel, &bandwidth, &decay);
	history_weight = PG_ARGISNULL(i) ? 0.0 : PG_GETARG_FLOAT8(i);
	check_nonnegative("history_weight", history_weight);
	has_radius = !PG_ARGISNULL(i + 1);
	radius = has_radius ? PG_GETARG_FLOAT8(i + 1) : 0.0;
	check_radius(has_radius, radius);

	PG_RETURN_DATUM(logits_record(fcinfo, a.ctx, a.n_ctx, a.keys, a.m, a.knn_ids, a.knn_w, a.knn_d, a.n_knn,
								  kernel, bandwidth, decay, history_weight, has_radius, radius));
}

Datum
htk_store(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"context", "keys", "knn_token_ids", "knn_weights", "knn_distances",
		"knn_memory", "kernel", "bandwidth", "centroid_decay", "", NULL};
	StepArrays	a;
	Kernel		kernel;
	double		bandwidth, decay, history_weight;
	bool	   *mem;
	int			n_mem;
	TupleDesc	tupdesc;
	Datum		values[11];
	bool		nulls[11];

	require_args(fcinfo, args);
	step_arrays(fcinfo, &a);
	mem = (bool *) array_items(PG_GETARG_ARRAYTYPE_P(5), BOOLOID, &n_mem, "knn_memory");
	if (n_mem != a.n_knn)
		BAD_ARG("knn_memory must be as long as knn_token_ids (%d), got %d", a.n_knn, n_mem);
	kernel = kernel_arg(PG_GETARG_TEXT_PP(6));
	bandwidth = PG_GETARG_FLOAT8(7);
	check_positive("bandwidth", bandwidth);
	decay = PG_GETARG_FLOAT8(8);
	check_decay(decay);
	check_backoff_decay(kernel, decay);
	history_weight = PG_ARGISNULL(9) ? 0.0 : PG_GETARG_FLOAT8(9);
	check_nonnegative("history_weight", history_weight);

	store_row(a.ctx, a.n_ctx, a.keys, a.keys + 3, a.m, a.knn_ids, a.knn_w, a.knn_d, mem, a.n_knn, kernel,
			  bandwidth, decay, history_weight, values, nulls);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		raise_bad("htk_store: must be called as a function returning a record");
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* ---------------------------------------------------------------------------------------- */
/* The whole step in C: htk_serves, htk_next_token, htk_step, htk_store_step, htk_stats     */
/* ---------------------------------------------------------------------------------------- */

/* Whether htk_next_token serves atom set set_id (rows layout, with token_blocks); false for NULL. */
Datum
htk_serves(PG_FUNCTION_ARGS)
{
	bool		served;

	if (PG_ARGISNULL(0))
		PG_RETURN_BOOL(false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "htk: SPI_connect failed");
	served = cached_set(PG_GETARG_INT32(0), NULL, false) != NULL;
	SPI_finish();
	trim_kept(state_limit(), NULL, NULL);
	PG_RETURN_BOOL(served);
}

/*
 * One next_token step in C for checked arguments; false where it does not serve (htk_serves) or
 * a context token is not in the set. Called inside SPI; the rows record is built in `caller`.
 * `known`: the set's row version where the caller read it (else read here).
 */
static bool
native_step(FunctionCallInfo fcinfo, MemoryContext caller, int32 set_id, const SetVersion *known,
			bool has_window, int window, double decay, int history, Kernel kernel, double bandwidth,
			double history_weight, const int32 *ctx, int n_ctx, double temperature,
			bool has_top_k, int top_k, bool has_top_p, double top_p, bool has_radius, double radius,
			int max_neighbors, double penalty, Datum *result)
{
	PositionCache *slot = cached_set(set_id, known, true);
	ContextState scratch, *st;
	int			m, n_knn = 0, n_terms = 0;
	int32	   *knn_ids;
	double	   *knn_w, *knn_d, z_lb;
	const double *center;
	Term	   *terms;
	Pruning		prune = {temperature, penalty};

	if (slot == NULL)
		return false;
	MemoryContextSwitchTo(caller);
	memset(&scratch, 0, sizeof(scratch));
	st = context_state(slot, has_window, window, decay, ctx, n_ctx, grid_cell(kernel == KERNEL_GAUSSIAN, bandwidth),
					   &scratch);
	if (st == NULL)
	{
		/* a foreign token (the SQL path names it) or a context too long to keep */
		if (scratch.mcxt != NULL)
			MemoryContextDelete(scratch.mcxt);
		trim_kept(state_limit(), NULL, NULL);
		return false;
	}
	step_stats.steps++;
	center = st->keys + 3 * (st->n - 1);
	m = history_weight > 0 && history > 0 && n_ctx > 1 ? Min(history, n_ctx - 1) : 0;
	knn_rows(set_id, center, max_neighbors, has_radius, radius, &knn_ids, &knn_w, &knn_d, &n_knn);
	MemoryContextSwitchTo(caller);	/* SPI left its own context current; the rows outlive it */

	terms = palloc(sizeof(Term) * (n_knn + m + 1));
	z_lb = stored_terms(knn_ids, knn_w, knn_d, n_knn, kernel, bandwidth, false, 0.0, &prune, terms,
						&n_terms);		/* the rows are within the radius already */
	if (kernel == KERNEL_BACKOFF)
		backoff_terms(st, m, center, decay, bandwidth, history_weight, has_radius, radius, terms, &n_terms);
	else if (m > 0)
		history_terms(st, m, center, kernel == KERNEL_GAUSSIAN, bandwidth, history_weight, has_radius, radius,
					  z_lb, n_knn, temperature, penalty, terms, &n_terms);
	checked_sort(terms, n_terms, sizeof(Term), term_order);
	*result = terms_record(fcinfo, ctx, n_ctx, terms, n_terms, temperature, has_top_k, top_k, has_top_p,
						   top_p, penalty);
	if (scratch.mcxt != NULL)
		MemoryContextDelete(scratch.mcxt);
	trim_kept(state_limit(), NULL, NULL);
	return true;
}

/*
 * The arguments htk_next_token and htk_step_logits share, 0-7: the atom set's id, centroid window,
 * decay, history window, kernel, bandwidth and history weight (its own, as ht_atom_set gives them)
 * and the context, checked (the callers check that the ones that must not be NULL are not).
 */
typedef struct
{
	int32		set_id;
	bool		has_window;
	int			window;
	double		decay;
	int			history;
	Kernel		kernel;
	double		bandwidth;
	double		history_weight;
	int32	   *ctx;
	int			n_ctx;
} SetStep;

static void
set_step_args(FunctionCallInfo fcinfo, SetStep *a)
{
	a->set_id = PG_GETARG_INT32(0);
	a->has_window = !PG_ARGISNULL(1);
	a->window = a->has_window ? PG_GETARG_INT32(1) : 0;
	check_window(a->has_window, a->window);
	a->decay = PG_GETARG_FLOAT8(2);
	check_decay(a->decay);
	a->history = PG_ARGISNULL(3) ? 0 : PG_GETARG_INT32(3);
	check_between("history_window", a->history, 0, MAX_HISTORY_WINDOW);
	a->kernel = kernel_arg(PG_GETARG_TEXT_PP(4));
	check_backoff_decay(a->kernel, a->decay);
	a->bandwidth = PG_GETARG_FLOAT8(5);
	check_positive("bandwidth", a->bandwidth);
	a->history_weight = PG_ARGISNULL(6) ? 0.0 : PG_GETARG_FLOAT8(6);
	check_nonnegative("history_weight", a->history_weight);
	a->ctx = context_items(PG_GETARG_ARRAYTYPE_P(7), &a->n_ctx);
}

/*
 * One next_token step in C (the set's own window, decay, kernel, bandwidth, history window and
 * weight; next_token's sampler arguments, each checked): the context's state (keys), the KNN
 * (ht_knn's rows, through SPI), the pruned history atoms, kernel and sampler. NULL when this
 * function does not serve the set (htk_serves) or a context token is not in the set: the caller
 * then takes the SQL path, which reports the token. Arguments: atom_set_id, centroid_window,
 * centroid_decay, history_window, kernel, bandwidth, history_weight, context, temperature, top_k,
 * top_p, search_radius, max_neighbors, repetition_penalty.
 */
Datum
htk_next_token_1_3(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"atom_set_id", "", "centroid_decay", "", "kernel", "bandwidth", "",
		"context", "temperature", "", "", "", "max_neighbors", "repetition_penalty", NULL};
	SetStep		a;
	bool		served;
	int			top_k, max_neighbors;
	double		temperature, top_p, radius, penalty;
	bool		has_top_k, has_top_p, has_radius;
	Datum		result = (Datum) 0;
	MemoryContext caller;

	require_args(fcinfo, args);
	set_step_args(fcinfo, &a);
	temperature = PG_GETARG_FLOAT8(8);
	has_top_k = !PG_ARGISNULL(9);
	top_k = has_top_k ? PG_GETARG_INT32(9) : 0;
	has_top_p = !PG_ARGISNULL(10);
	top_p = has_top_p ? PG_GETARG_FLOAT8(10) : 1.0;
	has_radius = !PG_ARGISNULL(11);
	radius = has_radius ? PG_GETARG_FLOAT8(11) : 0.0;
	max_neighbors = PG_GETARG_INT32(12);
	penalty = PG_GETARG_FLOAT8(13);
	check_sampler(temperature, has_top_k, top_k, has_top_p, top_p, penalty);
	check_radius(has_radius, radius);
	check_between("max_neighbors", max_neighbors, 1, MAX_NEIGHBORS);

	caller = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "htk: SPI_connect failed");
	served = native_step(fcinfo, caller, a.set_id, NULL, a.has_window, a.window, a.decay, a.history, a.kernel,
						 a.bandwidth, a.history_weight, a.ctx, a.n_ctx, temperature, has_top_k, top_k,
						 has_top_p, top_p, has_radius, radius, max_neighbors, penalty, &result);
	SPI_finish();
	if (!served)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

/*
 * Whether the C steps serve a set with these values (its own, the history overridden by the
 * caller's): the rows layout and values the C may run on. The set's own values are checked by
 * atom_sets' constraints; this keeps the C safe regardless.
 */
static bool
set_row_served(const SetRow *s)
{
	return s->rows && s->decay > 0.0 && s->decay <= 1.0 && (!s->has_window || s->window >= 1)
		&& (s->kernel != KERNEL_BACKOFF || s->decay < 1.0) && s->bandwidth > 0.0 && isfinite(s->bandwidth)
		&& s->history_weight >= 0.0 && isfinite(s->history_weight) && s->history >= 0
		&& s->history <= MAX_HISTORY_WINDOW;
}

/* A context as next_token accepts it (ht_check_context): its items, or NULL. */
static int32 *
step_context(FunctionCallInfo fcinfo, int arg, int *n_ctx)
{
	ArrayType  *a;

	if (PG_ARGISNULL(arg))
		return NULL;
	a = PG_GETARG_ARRAYTYPE_P(arg);
	if (ARR_ELEMTYPE(a) != INT4OID || ARR_NDIM(a) != 1 || ARR_DIMS(a)[0] < 1
		|| (ARR_HASNULL(a) && array_contains_nulls(a)))
		return NULL;
	*n_ctx = ARR_DIMS(a)[0];
	return (int32 *) ARR_DATA_PTR(a);
}

/* The history arguments as ht_check_sampler_args accepts them (NULL: the set's): false if not. */
static bool
history_args_ok(FunctionCallInfo fcinfo, int weight_arg, int window_arg)
{
	if (!PG_ARGISNULL(weight_arg) && !(PG_GETARG_FLOAT8(weight_arg) >= 0.0 && isfinite(PG_GETARG_FLOAT8(weight_arg))))
		return false;
	if (!PG_ARGISNULL(window_arg) && (PG_GETARG_INT32(window_arg) < 0 || PG_GETARG_INT32(window_arg) > MAX_HISTORY_WINDOW))
		return false;
	return true;
}

/* The caller's history arguments over the set's (ht_atom_set): no window without a weight. */
static void
override_history(FunctionCallInfo fcinfo, int weight_arg, int window_arg, SetRow *s)
{
	if (!PG_ARGISNULL(weight_arg))
		s->history_weight = PG_GETARG_FLOAT8(weight_arg);
	if (!PG_ARGISNULL(window_arg))
		s->history = PG_GETARG_INT32(window_arg);
	if (!(s->history_weight > 0))
		s->history = 0;
}

/*
 * next_token in one C call where it can serve it: htk_step(context, temperature, top_k, top_p,
 * search_radius, max_neighbors, atom_set, repetition_penalty, history_weight, history_window) ->
 * (token_ids, probabilities, cumulative), next_token's own arguments. It reads the atom set's row
 * itself and serves only arguments next_token accepts, for a set of the rows layout whose every
 * context token it holds; NULL otherwise, and next_token then takes its checked path, whose
 * messages (SQLSTATE 22023 naming the argument) stay the one source of what bad input is told.
 */
Datum
htk_step(PG_FUNCTION_ARGS)
{
	int			n_ctx = 0, top_k, max_neighbors;
	int32	   *ctx;
	double		temperature, top_p, radius, penalty;
	bool		has_top_k, has_top_p, has_radius, served = false;
	Datum		result = (Datum) 0;
	MemoryContext caller;
	SetRow		s;

	/* next_token's rules (ht_check_context, ht_check_sampler_args); anything else: NULL. */
	if (PG_ARGISNULL(1) || PG_ARGISNULL(5) || PG_ARGISNULL(7))
		PG_RETURN_NULL();
	ctx = step_context(fcinfo, 0, &n_ctx);
	if (ctx == NULL)
		PG_RETURN_NULL();
	temperature = PG_GETARG_FLOAT8(1);
	if (!(temperature == 0.0 || (temperature >= 1e-6 && temperature <= 1e6)))
		PG_RETURN_NULL();
	has_top_k = !PG_ARGISNULL(2);
	top_k = has_top_k ? PG_GETARG_INT32(2) : 0;
	if (top_k < 0)
		PG_RETURN_NULL();
	has_top_p = !PG_ARGISNULL(3);
	top_p = has_top_p ? PG_GETARG_FLOAT8(3) : 1.0;
	if (!(top_p > 0.0 && top_p <= 1.0))
		PG_RETURN_NULL();
	has_radius = !PG_ARGISNULL(4);
	radius = has_radius ? PG_GETARG_FLOAT8(4) : 0.0;
	if (!(radius >= 0.0))
		PG_RETURN_NULL();
	max_neighbors = PG_GETARG_INT32(5);
	if (max_neighbors < 1 || max_neighbors > MAX_NEIGHBORS)
		PG_RETURN_NULL();
	penalty = PG_GETARG_FLOAT8(7);
	if (!(penalty >= 1e-6 && penalty <= 1e6))
		PG_RETURN_NULL();
	if (!history_args_ok(fcinfo, 8, 9))
		PG_RETURN_NULL();

	caller = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "htk: SPI_connect failed");
	/* The atom set's row (ht_atom_set): by name, or the default one. */
	if (read_set_row(fcinfo, 6, &s))
	{
		override_history(fcinfo, 8, 9, &s);
		if (set_row_served(&s))
			served = native_step(fcinfo, caller, s.version.id, &s.version, s.has_window, s.window, s.decay,
								 s.history, s.kernel, s.bandwidth, s.history_weight, ctx, n_ctx, temperature,
								 has_top_k, top_k, has_top_p, top_p, has_radius, radius, max_neighbors,
								 penalty, &result);
	}
	SPI_finish();
	if (!served)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}

/*
 * store_distribution in one C call where it can serve it: htk_store_step(context, atom_set,
 * max_neighbors, history_weight, history_window, positions) -> store_distribution's rows, for its
 * own arguments without memory (next_token's C step reads the stored atoms only). The keys of the
 * last `positions` prefixes come from the session's context state (the kept context extended, or
 * cut back where this one leaves it: only keys of tokens not kept are computed), the KNN from
 * next_token's prepared plan, each row from store_row: the rows of the checked path (htk_keys'
 * keys, ht_store_knn's rows, htk_store), bit for bit. No rows for anything it does not serve (bad
 * input, the tiles layout, a set without token_blocks, a token the set lacks): store_distribution
 * then takes its checked path, whose messages stay the one source of what bad input is told.
 */
#define STORE_MAX_POSITIONS 64

Datum
htk_store_step(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n_ctx = 0, max_neighbors, positions;
	int32	   *ctx;
	MemoryContext caller;
	SetRow		s;
	PositionCache *slot = NULL;
	ContextState scratch, *st = NULL;

	InitMaterializedSRF(fcinfo, 0);
	/* store_distribution's rules (ht_check_context, ht_check_sampler_args, positions); else no rows */
	ctx = step_context(fcinfo, 0, &n_ctx);
	if (ctx == NULL || PG_ARGISNULL(2) || PG_ARGISNULL(5))
		return (Datum) 0;
	max_neighbors = PG_GETARG_INT32(2);
	positions = PG_GETARG_INT32(5);
	if (max_neighbors < 1 || max_neighbors > MAX_NEIGHBORS || !history_args_ok(fcinfo, 3, 4)
		|| positions < 1 || positions > Min(n_ctx, STORE_MAX_POSITIONS))
		return (Datum) 0;

	caller = CurrentMemoryContext;
	memset(&scratch, 0, sizeof(scratch));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "htk: SPI_connect failed");
	if (read_set_row(fcinfo, 1, &s))
	{
		override_history(fcinfo, 3, 4, &s);
		if (set_row_served(&s))
			slot = cached_set(s.version.id, &s.version, true);
	}
	MemoryContextSwitchTo(caller);
	if (slot != NULL)
		st = context_state(slot, s.has_window, s.window, s.decay, ctx, n_ctx,
						   grid_cell(s.kernel == KERNEL_GAUSSIAN, s.bandwidth), &scratch);
	for (int len = n_ctx - positions + 1; st != NULL && len <= n_ctx; len++)
	{
		/* prefix len: its centre is the key of prefix len, history key k that of prefix len - m + k - 1 */
		int			m = s.history > 0 && len > 1 ? Min(s.history, len - 1) : 0, n_knn = 0;
		const double *center = st->keys + 3 * (len - 1);
		int32	   *knn_ids;
		double	   *knn_w, *knn_d;
		Datum		values[12];
		bool		nulls[12];

		knn_rows(s.version.id, center, max_neighbors, false, 0.0, &knn_ids, &knn_w, &knn_d, &n_knn);
		MemoryContextSwitchTo(caller);	/* SPI left its own context current */
		values[0] = Int32GetDatum(len);
		nulls[0] = false;
		store_row(ctx, len, center, st->keys + 3 * (len - m - 1), m, knn_ids, knn_w, knn_d, NULL, n_knn,
				  s.kernel, s.bandwidth, s.decay, s.history_weight, values + 1, nulls + 1);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		pfree(knn_ids);
		pfree(knn_w);
		pfree(knn_d);
	}
	if (scratch.mcxt != NULL)
		MemoryContextDelete(scratch.mcxt);
	SPI_finish();
	trim_kept(state_limit(), NULL, NULL);
	return (Datum) 0;
}

/* This backend's counters of the native steps and the memory it keeps: htk_stats() -> one row. */
Datum
htk_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[10];
	bool		nulls[10];
	int			sets, contexts;
	Size		kept = kept_bytes(&sets, &contexts);

	memset(nulls, false, sizeof(nulls));
	values[0] = Int64GetDatum((int64) step_stats.steps);
	values[1] = Int64GetDatum((int64) step_stats.keys_computed);
	values[2] = Int64GetDatum((int64) step_stats.history_scored);
	values[3] = Int64GetDatum((int64) step_stats.history_skipped);
	values[4] = Int64GetDatum((int64) step_stats.grid_steps);
	values[5] = Int64GetDatum((int64) knn_boundary_ties);
	values[6] = Int64GetDatum((int64) kept);
	values[7] = Int32GetDatum(sets);
	values[8] = Int32GetDatum(contexts);
	values[9] = Int64GetDatum((int64) evictions);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		raise_bad("htk_stats: must be called as a function returning a record");
	tupdesc = BlessTupleDesc(tupdesc);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* ---------------------------------------------------------------------------------------- */
/* htk_pick, and htk_step_logits                                                            */
/* ---------------------------------------------------------------------------------------- */

/*
 * The 1-based index of the first row whose cumulative probability is > u; if rounding leaves
 * none, the last row with probability > 0 (else the last row); NULL for no rows. A NULL argument,
 * a u that is not a finite number or a NaN in the arrays is refused (22023 naming it).
 */
Datum
htk_pick(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"probabilities", "cumulative", "u", NULL};
	int			n, nc, last_positive = 0;
	double	   *p, *cum, u;

	require_args(fcinfo, args);
	p = float8_items(PG_GETARG_ARRAYTYPE_P(0), &n, "probabilities");
	cum = float8_items(PG_GETARG_ARRAYTYPE_P(1), &nc, "cumulative");
	u = PG_GETARG_FLOAT8(2);
	if (nc != n)
		BAD_ARG("cumulative must be as long as probabilities (%d), got %d", n, nc);
	if (!isfinite(u))
		BAD_ARG("u must be a finite number, got %s", float8out_internal(u));
	check_finite_items(p, n, "probabilities", ">= 0");
	check_finite_items(cum, n, "cumulative", "");
	if (n == 0)
		PG_RETURN_NULL();
	for (int i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (cum[i] > u)
			PG_RETURN_INT32(i + 1);
		if (p[i] > 0)
			last_positive = i + 1;
	}
	PG_RETURN_INT32(last_positive > 0 ? last_positive : n);
}

/*
 * htk_logits for a context, with the session's state: htk_step_logits(atom_set_id, centroid_window,
 * centroid_decay, history_window, kernel, bandwidth, history_weight, context, max_neighbors,
 * search_radius) -> htk_logits' record, for checked arguments. The keys come from the context state
 * (the new tokens' only) and the KNN from the index's own order without the radius (the nearest
 * stored atom is measured before it), as ht_step_logits' SQL path does; every term is scored (the
 * signals count every candidate). NULL where htk_next_token would not serve the call.
 */
Datum
htk_step_logits_1_3(PG_FUNCTION_ARGS)
{
	static const char *const args[] = {"atom_set_id", "", "centroid_decay", "", "kernel", "bandwidth", "",
		"context", "max_neighbors", "", NULL};
	SetStep		a;
	bool		has_radius;
	int			max_neighbors, m, n_knn = 0;
	double		radius;
	int32	   *knn_ids;
	double	   *knn_w, *knn_d, *keys;
	PositionCache *slot;
	ContextState scratch, *st;
	Datum		result = (Datum) 0;
	bool		served = false;
	MemoryContext caller;

	require_args(fcinfo, args);
	set_step_args(fcinfo, &a);
	max_neighbors = PG_GETARG_INT32(8);
	check_between("max_neighbors", max_neighbors, 1, MAX_NEIGHBORS);
	has_radius = !PG_ARGISNULL(9);
	radius = has_radius ? PG_GETARG_FLOAT8(9) : 0.0;
	check_radius(has_radius, radius);

	caller = CurrentMemoryContext;
	memset(&scratch, 0, sizeof(scratch));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "htk: SPI_connect failed");
	slot = cached_set(a.set_id, NULL, false);
	MemoryContextSwitchTo(caller);
	st = slot != NULL ? context_state(slot, a.has_window, a.window, a.decay, a.ctx, a.n_ctx,
									  grid_cell(a.kernel == KERNEL_GAUSSIAN, a.bandwidth), &scratch) : NULL;
	if (st != NULL)
	{
		/* htk_keys' layout: the centre, then the keys of prefixes n - m .. n - 1 */
		m = a.history_weight > 0 && a.history > 0 && a.n_ctx > 1 ? Min(a.history, a.n_ctx - 1) : 0;
		keys = palloc(sizeof(double) * 3 * (1 + m));
		memcpy(keys, st->keys + 3 * (a.n_ctx - 1), 3 * sizeof(double));
		if (m > 0)
			memcpy(keys + 3, st->keys + 3 * (a.n_ctx - m - 1), 3 * m * sizeof(double));
		knn_rows(a.set_id, keys, max_neighbors, false, 0.0, &knn_ids, &knn_w, &knn_d, &n_knn);
		MemoryContextSwitchTo(caller);
		result = logits_record(fcinfo, a.ctx, a.n_ctx, keys, m, knn_ids, knn_w, knn_d, n_knn, a.kernel,
							   a.bandwidth, a.decay, a.history_weight, has_radius, radius);
		served = true;
	}
	if (scratch.mcxt != NULL)
		MemoryContextDelete(scratch.mcxt);
	SPI_finish();
	trim_kept(state_limit(), NULL, NULL);
	if (!served)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(result);
}
