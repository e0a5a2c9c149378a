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
 */
#include "postgres.h"

#include <float.h>
#include <math.h>

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/params.h"
#include "tcop/dest.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/tuplestore.h"
#include "utils/memutils.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/float.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"
#include "storage/itemptr.h"

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

/* Direct windowed sums up to this many elements per key; longer windows use the recursion. */
#define DIRECT_WINDOW 64
/* exp() below these exponents counts as 0, as in the PL/pgSQL reference. */
#define LSE_CUTOFF (-744.0)
#define SOFTMAX_CUTOFF (-700.0)

/* hartonomous_kernel.max_state_memory, in kB: what a backend keeps between calls (see the header). */
static int	max_state_kb = 65536;

void		_PG_init(void);

void
_PG_init(void)
{
	DefineCustomIntVariable("hartonomous_kernel.max_state_memory",
							"Memory a backend keeps between native next_token calls: cached token positions and context states.",
							"Beyond it the least recently used are dropped; a context or an atom set larger than it alone is not kept.",
							&max_state_kb, 65536, 64, MAX_KILOBYTES, PGC_SUSET, GUC_UNIT_KB,
							NULL, NULL, NULL);
	MarkGUCPrefixReserved("hartonomous_kernel");
}

static Size
state_limit(void)
{
	return (Size) max_state_kb * 1024;
}

static void
raise_bad(const char *message)
{
	ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message)));
}

/* Bad arguments: SQLSTATE 22023, the message naming the argument as the SQL functions do. */
#define BAD_ARG(...) ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg(__VA_ARGS__)))

/* The limits of next_token's arguments (ht_check_sampler_args, sql/020_next_token.sql). */
#define MAX_NEIGHBORS 100000
#define MAX_HISTORY_WINDOW 4096

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

/* The kernels of atom_sets.kernel. */
typedef enum
{
	KERNEL_GAUSSIAN,
	KERNEL_EXPONENTIAL,
	KERNEL_BACKOFF
} Kernel;

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

static ArrayType *
float8_array(const double *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * (n > 0 ? n : 1));

	for (int i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		d[i] = Float8GetDatum(v[i]);
	}
	return construct_array(d, n, FLOAT8OID, sizeof(float8), FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

static ArrayType *
int4_array(const int32 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * (n > 0 ? n : 1));

	for (int i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		d[i] = Int32GetDatum(v[i]);
	}
	return construct_array(d, n, INT4OID, sizeof(int32), true, TYPALIGN_INT);
}

/*
 * qsort with a cancel check every 2^16 comparisons: every sort here may run over caller-sized input
 * (a context, the KNN's rows, the candidates), so none waits out a cancel. `cmp` rides as qsort_arg's
 * argument; an error thrown from it leaves nothing behind (the arrays are palloc'd).
 */
static int
checked_cmp(const void *a, const void *b, void *arg)
{
	static uint32 ticks = 0;

	if ((++ticks & 0xFFFF) == 0)
		CHECK_FOR_INTERRUPTS();
	return ((int (*) (const void *, const void *)) arg) (a, b);
}

#define checked_sort(base, n, size, cmp) qsort_arg((base), (n), (size), checked_cmp, (void *) (cmp))

/*
 * The SQL reference computes in PostgreSQL's float8, whose operators refuse a finite operation that
 * overflows or underflows (22003, "value out of range"); the C computes the same expressions with
 * the same checks (float8_div, float8_mul, checked_pow), so it raises where the reference raises
 * rather than return NaN or infinity.
 */
static double
checked_pow(double x, double y)
{
	double		r = pow(x, y);

	if (isinf(r) && !isinf(x) && !isinf(y))
		float_overflow_error();
	if (r == 0.0 && x != 0.0)
		float_underflow_error();
	return r;
}

/* float8 -> integer as SQL's ::integer (rounded, 22003 "integer out of range" outside int4). */
static int32
checked_int4(double v)
{
	v = rint(v);
	if (isnan(v) || !FLOAT8_FITS_IN_INT32(v))
		ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), errmsg("integer out of range")));
	return (int32) v;
}

/* ---------------------------------------------------------------------------------------- */
/* htk_keys                                                                                 */
/* ---------------------------------------------------------------------------------------- */

/*
 * The weight of the element k steps back from a prefix's newest one (k = 0: the newest), as the
 * reference defines it: 0 outside the window, 1 without decay, 0 where k ln(decay) < -300.
 */
static double
weight_at(int k, bool has_window, int window, double decay, double ln_decay)
{
	if (has_window && k >= window)
		return 0.0;
	if (decay == 1.0)
		return 1.0;
	if ((double) k * ln_decay < -300.0)
		return 0.0;
	return pow(decay, (double) k);
}

/* The centroid of elements 0 .. e - 1 (0-based) by direct sums, oldest element first. */
static void
centroid_direct(const double *xs, const double *ys, const double *zs, int e, int reach,
				bool has_window, int window, double decay, double ln_decay, double *out)
{
	double		sx = 0, sy = 0, sz = 0, sw = 0;
	int			first = reach > 0 && e - reach > 0 ? e - reach : 0;

	for (int j = first; j < e; j++)
	{
		double		w = weight_at(e - 1 - j, has_window, window, decay, ln_decay);

		sx += w * xs[j];
		sy += w * ys[j];
		sz += w * zs[j];
		sw += w;
	}
	out[0] = sx / sw;
	out[1] = sy / sw;
	out[2] = sz / sw;
}

/*
 * The centre and the m = min(history, n - 1) history keys (0 when history <= 0) of a context of n
 * positions (x, y, z each), for checked arguments: 3 * (1 + m) numbers, the centre first.
 */
static double *
compute_keys(const double *xyz, int n, bool has_window, int window, double decay, int history, int *m_out)
{
	double	   *xs = palloc(sizeof(double) * n);
	double	   *ys = palloc(sizeof(double) * n);
	double	   *zs = palloc(sizeof(double) * n);
	double		ln_decay = log(decay);
	int			m = 0;
	int			reach;			/* elements with a non-zero weight; 0 = all of them */
	double	   *out;

	for (int i = 0; i < n; i++)
	{
		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		xs[i] = xyz[3 * i];
		ys[i] = xyz[3 * i + 1];
		zs[i] = xyz[3 * i + 2];
	}
	/* Beyond K = floor(300 / -ln decay) + 1 elements back every weight is 0. */
	reach = has_window ? window : 0;
	if (ln_decay < 0.0)
	{
		double		k = floor(300.0 / -ln_decay) + 1.0;

		if (reach == 0 || k < reach)
			reach = k > INT_MAX ? INT_MAX : (int) k;
	}
	if (history > 0 && n > 1)
		m = history < n - 1 ? history : n - 1;

	out = palloc(sizeof(double) * 3 * (1 + m));
	if (reach > 0 && reach <= DIRECT_WINDOW)
	{
		centroid_direct(xs, ys, zs, n, reach, has_window, window, decay, ln_decay, out);
		for (int k = 1; k <= m; k++)
		{
			CHECK_FOR_INTERRUPTS();
			centroid_direct(xs, ys, zs, n - m + k - 1, reach, has_window, window, decay, ln_decay,
							out + 3 * k);
		}
	}
	else
	{
		/*
		 * Long or unbounded windows: S_e = d S_{e-1} + p_e - d^W p_{e-W} (the element leaving
		 * the window), the same for the weights' sum. The recursion contracts (d <= 1), so
		 * rounding does not grow; weights below e^-300 are kept rather than cut, a relative
		 * change below 1e-130.
		 */
		double		sx = 0, sy = 0, sz = 0, sw = 0;
		double		d_w = reach > 0 ? pow(decay, (double) reach) : 0.0;
		int			first_key_e = n - m;	/* the first key's prefix length */

		for (int e = 1; e <= n; e++)
		{
			int			j = e - 1;

			if ((e & 0xFFFF) == 0)
				CHECK_FOR_INTERRUPTS();
			sx = decay * sx + xs[j];
			sy = decay * sy + ys[j];
			sz = decay * sz + zs[j];
			sw = decay * sw + 1.0;
			if (reach > 0 && e - reach >= 1)
			{
				int			o = e - reach - 1;

				sx -= d_w * xs[o];
				sy -= d_w * ys[o];
				sz -= d_w * zs[o];
				sw -= d_w;
			}
			if (e == n || (m > 0 && e >= first_key_e))
			{
				/* the centre last (e = n), as the session's context state computes it */
				double	   *key = e == n ? out : out + 3 * (e - first_key_e + 1);

				key[0] = sx / sw;
				key[1] = sy / sw;
				key[2] = sz / sw;
			}
		}
	}
	*m_out = m;
	return out;
}

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

/* ---------------------------------------------------------------------------------------- */
/* htk_distribution                                                                         */
/* ---------------------------------------------------------------------------------------- */

typedef struct
{
	int32		tid;
	double		c;				/* ln(weight) - kernel(distance / bandwidth) */
	double		d;				/* the distance to the centroid */
	bool		hist;			/* a history atom (else a stored KNN row) */
	bool		mem;			/* a KNN row from the memory of past generations (htk_store only) */
} Term;

typedef struct
{
	int32		tid;
	double		z;				/* the scaled logit */
	double		e;				/* exp(dz) of the current stage */
	double		p;
} Cand;

/*
 * Token id, then the term: a canonical order up to equal values, so a token's log-sum-exp is the
 * same bits whatever order the KNN or the history gave its terms in (both layouts, the grid).
 */
static int
term_order(const void *a, const void *b)
{
	const Term *x = a, *y = b;

	if (x->tid != y->tid)
		return (x->tid > y->tid) - (x->tid < y->tid);
	return (x->c < y->c) - (x->c > y->c);
}

static int
int32_cmp(const void *a, const void *b)
{
	int32		x = *(const int32 *) a, y = *(const int32 *) b;

	return (x > y) - (x < y);
}

/* z descending, token id ascending: the sampler's order. */
static int
cand_by_z(const void *a, const void *b)
{
	const Cand *x = a, *y = b;

	if (x->z != y->z)
		return x->z > y->z ? -1 : 1;
	return (x->tid > y->tid) - (x->tid < y->tid);
}

/* probability descending, token id ascending: the order of next_token's rows. */
static int
cand_by_p(const void *a, const void *b)
{
	const Cand *x = a, *y = b;

	if (x->p != y->p)
		return x->p > y->p ? -1 : 1;
	return (x->tid > y->tid) - (x->tid < y->tid);
}

/*
 * (d / h)^2, d / h, or 0 for the backoff kernel (its candidates score ln(weight) inside the radius:
 * backoff_cut); x * x is pow(x, 2) exactly (both correctly rounded), and cheaper. Overflow and
 * underflow raise 22003, as the reference's (d / h) ^ 2 does (distances 1e10 at bandwidth 1e-150).
 */
static double
kernel_term(double d, Kernel kernel, double bandwidth)
{
	double		x;

	if (kernel == KERNEL_BACKOFF)
		return 0.0;
	x = float8_div(d, bandwidth);
	return kernel == KERNEL_GAUSSIAN ? float8_mul(x, x) : x;
}

/*
 * The backoff kernel's tolerance t = min(h * 1e-12, 1e-14) (hartonomous/kernel.py backoff_tolerance):
 * a nearest distance within it counts as 0, and the radius is never below it. A history key that
 * equals the centre in exact arithmetic lies at 0 in one implementation and at ~1e-17 in another
 * (keys from running sums); both are kept. The cap keeps matches the keys can tell apart distinct.
 */
#define BACKOFF_TOLERANCE 1e-12
#define BACKOFF_TOLERANCE_CAP 1e-14

static double
backoff_tolerance(double bandwidth)
{
	return fmin(bandwidth * BACKOFF_TOLERANCE, BACKOFF_TOLERANCE_CAP);
}

/*
 * The backoff kernel's radius (sql/020_next_token.sql ht_backoff_radius, the same arithmetic): the
 * smallest of h, h d, h d^2, ... (any integer power of the decay d) that holds the nearest
 * candidate, at distance nearest, and never below backoff_tolerance(h); that tolerance when the
 * nearest distance is within it (counts as 0).
 */
static double
backoff_radius(double nearest, double bandwidth, double decay)
{
	double		tolerance = backoff_tolerance(bandwidth);

	if (!(nearest > tolerance))
		return tolerance;
	return fmax(tolerance, float8_mul(bandwidth, checked_pow(decay, floor(log(float8_div(nearest, bandwidth))
																		  / log(decay)))));
}

/*
 * The backoff kernel (hartonomous/kernel.py): of the candidates terms[0 .. *n - 1] (stored and
 * history atoms within search_radius, each scoring ln(weight)), only those within the radius of
 * the nearest one count. Compacts the terms in place.
 */
static void
backoff_cut(Term *terms, int *n, double bandwidth, double decay)
{
	double		nearest = get_float8_infinity(), r;
	int			kept = 0;

	for (int i = 0; i < *n; i++)
		nearest = fmin(nearest, terms[i].d);
	r = backoff_radius(nearest, bandwidth, decay);
	for (int i = 0; i < *n; i++)
		if (terms[i].d <= r)
			terms[kept++] = terms[i];
	*n = kept;
}

/* exp(dz) of stage rows start..end-1 relative to the first one (the largest z); returns the sum. */
static double
stage_exp(Cand *c, int count)
{
	double		top = c[0].z, sum = 0;

	for (int i = 0; i < count; i++)
	{
		double		dz = c[i].z - top;

		if ((i & 0xFFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		c[i].e = dz < SOFTMAX_CUTOFF ? 0.0 : exp(dz);
		sum += c[i].e;
	}
	return sum;
}

/* The pruning arithmetic; every bound errs on the side of keeping a term. */

/* The smallest scaled logit a raw logit x can have: penalised or not, over T (1 at T = 0). */
static double
scaled_floor(double x, double temperature, double penalty)
{
	double		p = x < 0 ? x * penalty : x / penalty;

	return fmin(x, p) / (temperature > 0 ? temperature : 1.0);
}

/* The smallest raw logit whose scaled logit, penalised or not, can reach z. */
static double
raw_floor(double z, double temperature, double penalty)
{
	double		u = z * (temperature > 0 ? temperature : 1.0);
	double		p = u < 0 ? u / penalty : u * penalty;

	return fmin(u, p);
}

/*
 * Exact pruning of history atoms. With z_lb a lower bound of the step's largest scaled logit (from
 * the stored atoms' terms: a token's logit is at least its largest term's), a row keeps a non-zero
 * probability only if its scaled logit is >= z_lb - 700 (the softmax's cutoff), so its raw logit
 * x >= y = raw_floor(z_lb - 700), so its largest term is >= y - ln N (N: the terms a token can
 * have: n_stored + m), and the reference counts every term below that largest one - 744 as 0. A
 * history term c < y - ln N - 745 therefore changes no row of non-zero probability (it can only
 * make or move rows whose probability is exactly 0). Returns the distance from the centre beyond
 * which a history atom's term is below that cut (or beyond search_radius): infinity when nothing
 * can be cut.
 */
static double
prune_reach(double z_lb, double temperature, double penalty, int n_stored, int m, bool gaussian,
			double bandwidth, double history_weight, bool has_radius, double radius)
{
	double		reach = get_float8_infinity();

	if (isfinite(z_lb))
	{
		double		cut = raw_floor(z_lb + SOFTMAX_CUTOFF, temperature, penalty) - log((double) (n_stored + m))
			+ LSE_CUTOFF - 1.0;
		double		k = log(history_weight) - cut;	/* the kernel value beyond which a term is cut */

		if (isfinite(k))
			reach = k <= 0 ? 0 : bandwidth * (gaussian ? sqrt(k) : k) * (1.0 + 1e-9);
	}
	if (has_radius && radius < reach)
		reach = radius;
	return reach;
}

/* The sampler's arguments, for pruning (NULL: every term is kept, as for the signals). */
typedef struct
{
	double		temperature;
	double		penalty;
} Pruning;

/*
 * The stored atoms' kernel terms, ln(weight) - kernel(distance / h), of the KNN rows within
 * search_radius, appended to terms; with `prune`, returns the lower bound of the step's largest
 * scaled logit that prune_reach starts from (else -infinity).
 */
static double
stored_terms(const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn, Kernel kernel,
			 double bandwidth, bool has_radius, double radius, const Pruning *prune, Term *terms, int *n)
{
	double		z_lb = -get_float8_infinity();

	for (int i = 0; i < n_knn; i++)
	{
		Term	   *t = &terms[*n];

		CHECK_FOR_INTERRUPTS();

		if (has_radius && !(knn_d[i] <= radius))
			continue;
		t->tid = knn_ids[i];
		t->c = log(knn_w[i]) - kernel_term(knn_d[i], kernel, bandwidth);
		t->d = knn_d[i];
		t->hist = false;
		t->mem = false;
		if (prune != NULL && isfinite(t->c))
			z_lb = fmax(z_lb, scaled_floor(t->c, prune->temperature, prune->penalty));
		(*n)++;
	}
	return z_lb;
}

/*
 * Kernel terms, ln(weight) - kernel(distance / h): the KNN rows within search_radius, then (with
 * history_weight > 0) the m history atoms within it; key k (1-based) is the atom of context
 * element n - m + k. With `prune`, the history atoms beyond prune_reach are left out (not for the
 * backoff kernel, whose candidates are cut by backoff_cut). Sorted by term_order.
 */
static Term *
collect_terms(const int32 *ctx, int n_ctx, const double *keys, int m, const int32 *knn_ids,
			  const double *knn_w, const double *knn_d, int n_knn, Kernel kernel, double bandwidth,
			  double decay, double history_weight, bool has_radius, double radius, const Pruning *prune,
			  int *n_out)
{
	Term	   *terms = palloc(sizeof(Term) * (n_knn + (m > 0 ? m : 0) + 1));
	int			n = 0;
	int			after = n_ctx - m;
	double		z_lb;

	if (kernel == KERNEL_BACKOFF)
		prune = NULL;
	z_lb = stored_terms(knn_ids, knn_w, knn_d, n_knn, kernel, bandwidth, has_radius, radius, prune, terms, &n);
	if (history_weight > 0 && m > 0)
	{
		double		ln_w = log(history_weight);
		double		reach = prune == NULL ? get_float8_infinity()
			: prune_reach(z_lb, prune->temperature, prune->penalty, n, m, kernel == KERNEL_GAUSSIAN, bandwidth,
						  history_weight, false, 0.0);

		for (int k = 1; k <= m; k++)
		{
			const double *key = keys + 3 * k;
			double		dx = key[0] - keys[0], dy = key[1] - keys[1], dz = key[2] - keys[2];
			double		d = sqrt(dx * dx + dy * dy + dz * dz);

			CHECK_FOR_INTERRUPTS();
			if ((has_radius && !(d <= radius)) || d > reach)
				continue;
			terms[n].tid = ctx[after + k - 1];
			terms[n].c = ln_w - kernel_term(d, kernel, bandwidth);
			terms[n].d = d;
			terms[n].hist = true;
			terms[n].mem = false;
			n++;
		}
	}
	if (kernel == KERNEL_BACKOFF)
		backoff_cut(terms, &n, bandwidth, decay);
	checked_sort(terms, n, sizeof(Term), term_order);
	*n_out = n;
	return terms;
}

/* Per token (terms sorted by id): max + ln(sum exp(c - max)), terms below the cutoff counting as 0. */
static Cand *
token_logits(const Term *terms, int n_terms, int *n_out)
{
	Cand	   *cands = palloc(sizeof(Cand) * (n_terms + 1));
	int			n = 0;

	for (int i = 0; i < n_terms;)
	{
		int			j = i;
		double		top = terms[i].c, sum = 0;

		CHECK_FOR_INTERRUPTS();

		while (j < n_terms && terms[j].tid == terms[i].tid)
		{
			if (terms[j].c > top)
				top = terms[j].c;
			j++;
		}
		for (int t = i; t < j; t++)
			sum += terms[t].c - top < LSE_CUTOFF ? 0.0 : exp(terms[t].c - top);
		cands[n].tid = terms[i].tid;
		cands[n].z = top + log(sum);
		n++;
		i = j;
	}
	*n_out = n;
	return cands;
}

/*
 * The shared sampler over per-token logits (cands[i].z): repetition penalty over the context's
 * distinct ids, temperature, top-k or T = 0, top-p, renormalisation; values[0..2] get next_token's
 * rows as arrays (token ids, probabilities, cumulative), ordered by probability, then id.
 */
static void
sampler_rows(const int32 *ctx, int n_ctx, Cand *cands, int n_cands, double temperature,
			 bool has_top_k, int top_k, bool has_top_p, double top_p, double penalty, Datum *values)
{
	int32	   *sorted_ctx = NULL;
	int			kept;

	/* Repetition penalty over the context's distinct ids, then temperature. */
	if (penalty != 1.0 && n_cands > 0)
	{
		sorted_ctx = palloc(sizeof(int32) * n_ctx);
		memcpy(sorted_ctx, ctx, sizeof(int32) * n_ctx);
		checked_sort(sorted_ctx, n_ctx, sizeof(int32), int32_cmp);
	}
	for (int i = 0; i < n_cands; i++)
	{
		double		x = cands[i].z;

		CHECK_FOR_INTERRUPTS();
		if (sorted_ctx != NULL &&
			bsearch(&cands[i].tid, sorted_ctx, n_ctx, sizeof(int32), int32_cmp) != NULL)
			x = x < 0 ? x * penalty : x / penalty;
		cands[i].z = temperature > 0 ? x / temperature : x;
	}

	/* Top-k (rank: ties at the k-th kept) or, at T = 0, the first row alone. */
	checked_sort(cands, n_cands, sizeof(Cand), cand_by_z);
	kept = n_cands;
	if (temperature <= 0 && kept > 1)
		kept = 1;
	else if (has_top_k && top_k > 0 && kept > top_k)
	{
		/* rank of row i = 1 + the rows with a larger z: keep while that is <= top_k. */
		int			i = top_k;

		while (i < kept && cands[i].z == cands[top_k - 1].z)
			i++;
		kept = i;
	}

	/* Top-p over the softmax of the kept rows: keep a row while the mass before it is < p. */
	if (kept > 0 && has_top_p && top_p < 1.0)
	{
		double		sum = stage_exp(cands, kept), before = 0;
		int			i = 0;

		while (i < kept && before < top_p)
		{
			before += cands[i].e / sum;
			i++;
		}
		kept = i;
	}

	/* Renormalise, order by probability, cumulate. */
	if (kept > 0)
	{
		double		sum = stage_exp(cands, kept), cum = 0;
		int32	   *ids = palloc(sizeof(int32) * kept);
		double	   *ps = palloc(sizeof(double) * kept);
		double	   *cs = palloc(sizeof(double) * kept);

		for (int i = 0; i < kept; i++)
			cands[i].p = cands[i].e / sum;
		checked_sort(cands, kept, sizeof(Cand), cand_by_p);
		for (int i = 0; i < kept; i++)
		{
			ids[i] = cands[i].tid;
			ps[i] = cands[i].p;
			cum += cands[i].p;
			cs[i] = cum;
		}
		values[0] = PointerGetDatum(int4_array(ids, kept));
		values[1] = PointerGetDatum(float8_array(ps, kept));
		values[2] = PointerGetDatum(float8_array(cs, kept));
	}
	else
	{
		values[0] = PointerGetDatum(int4_array(NULL, 0));
		values[1] = PointerGetDatum(float8_array(NULL, 0));
		values[2] = PointerGetDatum(float8_array(NULL, 0));
	}
}

/* next_token's rows from a step's kernel terms (sorted by token id), as the (token_ids, probabilities,
 * cumulative) record. */
static Datum
terms_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, Term *terms, int n_terms,
			 double temperature, bool has_top_k, int top_k, bool has_top_p, double top_p, double penalty)
{
	int			n_cands = 0;
	Cand	   *cands;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	cands = token_logits(terms, n_terms, &n_cands);
	sampler_rows(ctx, n_ctx, cands, n_cands, temperature, has_top_k, top_k, has_top_p, top_p, penalty, values);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		raise_bad("htk: must be called as a function returning a record");
	tupdesc = BlessTupleDesc(tupdesc);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/* next_token's rows for checked inputs (history atoms pruned exactly), as the (token_ids,
 * probabilities, cumulative) record. */
static Datum
rows_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, const double *keys, int m,
			const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn, Kernel kernel,
			double bandwidth, double decay, double history_weight, bool has_radius, double radius,
			double temperature, bool has_top_k, int top_k, bool has_top_p, double top_p, double penalty)
{
	int			n_terms = 0;
	Pruning		prune = {temperature, penalty};
	Term	   *terms = collect_terms(ctx, n_ctx, keys, m, knn_ids, knn_w, knn_d, n_knn, kernel,
									  bandwidth, decay, history_weight, has_radius, radius, &prune, &n_terms);

	return terms_record(fcinfo, ctx, n_ctx, terms, n_terms, temperature, has_top_k, top_k, has_top_p,
						top_p, penalty);
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

/* ---------------------------------------------------------------------------------------- */
/* htk_logits                                                                               */
/* ---------------------------------------------------------------------------------------- */

/* htk_logits' record for checked inputs: the raw logits and the signals from every term (no pruning). */
static Datum
logits_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, const double *keys, int m,
			  const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn, Kernel kernel,
			  double bandwidth, double decay, double history_weight, bool has_radius, double radius)
{
	int			n_terms = 0, n_cands = 0;
	Term	   *terms;
	Cand	   *cands;
	TupleDesc	tupdesc;
	Datum		values[13];
	bool		nulls[13];

	terms = collect_terms(ctx, n_ctx, keys, m, knn_ids, knn_w, knn_d, n_knn, kernel, bandwidth, decay,
						  history_weight, has_radius, radius, NULL, &n_terms);	/* signals: every term */
	cands = token_logits(terms, n_terms, &n_cands);
	memset(nulls, true, sizeof(nulls));
	{
		int32	   *ids = palloc(sizeof(int32) * (n_cands + 1));
		double	   *zs = palloc(sizeof(double) * (n_cands + 1));

		for (int i = 0; i < n_cands; i++)
		{
			ids[i] = cands[i].tid;
			zs[i] = cands[i].z;
		}
		values[0] = PointerGetDatum(int4_array(ids, n_cands));
		values[1] = PointerGetDatum(float8_array(zs, n_cands));
		nulls[0] = nulls[1] = false;
	}
	values[9] = Int32GetDatum(n_cands);			/* distinct_tokens */
	nulls[9] = false;
	if (n_knn > 0)
	{
		double		nearest = knn_d[0];

		for (int i = 1; i < n_knn; i++)
			if (knn_d[i] < nearest)
				nearest = knn_d[i];
		values[7] = Float8GetDatum(float8_div(nearest, bandwidth));	/* nearest_bandwidths */
		nulls[7] = false;
	}
	if (n_cands > 0)
	{
		/* The kernel's own distribution: e = exp(c - max c) over every term (0 below -700), summed per token. */
		double		top_c = terms[0].c, total = 0, hist_total = 0;
		double	   *e = palloc(sizeof(double) * n_cands), *dmin = palloc(sizeof(double) * n_cands);
		double	   *dhist = palloc(sizeof(double) * n_cands);
		int		   *votes = palloc(sizeof(int) * n_cands);
		int			k = -1, best = 0;
		double		h = 0, s2 = 0, v = 0, pmax = 0;

		for (int i = 1; i < n_terms; i++)
			if (terms[i].c > top_c)
				top_c = terms[i].c;
		for (int i = 0; i < n_terms; i++)
		{
			double		x = terms[i].c - top_c < -700.0 ? 0.0 : exp(terms[i].c - top_c);

			CHECK_FOR_INTERRUPTS();

			if (i == 0 || terms[i].tid != terms[i - 1].tid)
			{
				k++;
				e[k] = 0;
				dmin[k] = terms[i].d;
				dhist[k] = -1;
				votes[k] = 0;
			}
			e[k] += x;
			if (terms[i].d < dmin[k])
				dmin[k] = terms[i].d;
			if (terms[i].hist)
			{
				if (dhist[k] < 0 || terms[i].d < dhist[k])
					dhist[k] = terms[i].d;
				hist_total += x;
			}
			else
				votes[k]++;
			total += x;
		}
		for (int i = 1; i < n_cands; i++)	/* the largest mass; ties: the lowest id (ids ascend) */
			if (e[i] > e[best])
				best = i;
		for (int i = 0; i < n_cands; i++)
		{
			double		p = e[i] / total;

			if (p > pmax)
				pmax = p;
			if (p > 1e-150)
			{
				h -= p * log(p);
				s2 += p * p;
			}
		}
		for (int i = 0; i < n_cands; i++)
		{
			double		p = e[i] / total;

			if (p > 1e-150)
				v += p * (log(p) + h) * (log(p) + h);
		}
		values[2] = Float8GetDatum(h);
		values[3] = Float8GetDatum(-log(s2));
		values[4] = Float8GetDatum(v);
		values[5] = Float8GetDatum(-log(s2) - (h - 0.5 * v));
		values[6] = Float8GetDatum(pmax);
		values[8] = Float8GetDatum(hist_total / total);
		values[10] = Float8GetDatum(log(dmin[best] / bandwidth + 0.01));
		values[11] = Float8GetDatum(log(1.0 + votes[best]));
		values[12] = Float8GetDatum(log((dhist[best] < 0 ? 10.0 : fmin(10.0, dhist[best] / bandwidth)) + 0.01));
		for (int i = 2; i <= 12; i++)
			if (i != 7 && i != 9)
				nulls[i] = false;
	}
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		raise_bad("htk_logits: must be called as a function returning a record");
	tupdesc = BlessTupleDesc(tupdesc);
	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
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

/* ---------------------------------------------------------------------------------------- */
/* htk_store                                                                                */
/* ---------------------------------------------------------------------------------------- */

/*
 * store_distribution's row for one prefix (sql/090_store.sql, whose PL/pgSQL reference defines it):
 * htk_store(context, keys, knn_token_ids, knn_weights, knn_distances, knn_memory, kernel, bandwidth,
 * centroid_decay, history_weight) -> (token_ids, probabilities, nearest_bandwidths, rung,
 * matched_mass, candidates, top_probability, entropy, stored_share, history_share, memory_share).
 * The candidates are the KNN rows (knn_memory[i]: row i is a memory atom) and the history atoms of
 * the keys (htk_keys' layout), none pruned and no search radius; the probabilities are next_token's
 * at T = 1 without top-k, top-p or penalty: per-token log-sum-exp, then the softmax (token ids
 * ascending). With c the counting terms ln(w) - kernel(d / h), M = max c and e = exp(c - M) (0
 * below -744): matched_mass = exp(M + ln sum e) (0 below e^-744), the shares are each source's sum
 * of e over sum e. No candidate: empty arrays, candidates 0, matched_mass 0, the rest NULL.
 */
/*
 * store_distribution's row for one prefix of n_ctx tokens, for checked inputs: its centre, the
 * m history keys (key k, 1-based, at hist + 3 (k - 1): the atom of element n_ctx - m + k) and its
 * KNN rows (knn_mem[i]: row i is a memory atom; NULL: none is). values/nulls: htk_store's eleven
 * columns. The one arithmetic of htk_store and htk_store_step.
 */
static void
store_row(const int32 *ctx, int n_ctx, const double *center, const double *hist, int m, const int32 *knn_ids,
		  const double *knn_w, const double *knn_d, const bool *knn_mem, int n_knn, Kernel kernel,
		  double bandwidth, double decay, double history_weight, Datum *values, bool *nulls)
{
	double		nearest = get_float8_infinity();
	int			n = 0, n_cands = 0, after;
	Term	   *terms;
	Cand	   *cands;

	/* Every candidate: the KNN rows, then the history atoms. */
	terms = palloc(sizeof(Term) * (n_knn + m + 1));
	for (int i = 0; i < n_knn; i++)
	{
		CHECK_FOR_INTERRUPTS();
		terms[n].tid = knn_ids[i];
		terms[n].c = log(knn_w[i]) - kernel_term(knn_d[i], kernel, bandwidth);
		terms[n].d = knn_d[i];
		terms[n].hist = false;
		terms[n].mem = knn_mem != NULL && knn_mem[i];
		n++;
	}
	after = n_ctx - m;
	for (int k = 1; k <= m && history_weight > 0; k++)
	{
		const double *key = hist + 3 * (k - 1);
		double		dx = key[0] - center[0], dy = key[1] - center[1], dz = key[2] - center[2];
		double		d = sqrt(dx * dx + dy * dy + dz * dz);

		CHECK_FOR_INTERRUPTS();
		terms[n].tid = ctx[after + k - 1];
		terms[n].c = log(history_weight) - kernel_term(d, kernel, bandwidth);
		terms[n].d = d;
		terms[n].hist = true;
		terms[n].mem = false;
		n++;
	}
	for (int i = 0; i < n; i++)
		nearest = fmin(nearest, terms[i].d);

	memset(nulls, true, sizeof(bool) * 11);
	values[4] = Float8GetDatum(0.0);	/* matched_mass */
	values[5] = Int32GetDatum(0);		/* candidates */
	nulls[4] = nulls[5] = false;
	if (n > 0)
	{
		values[2] = Float8GetDatum(float8_div(nearest, bandwidth));
		nulls[2] = false;
		if (kernel == KERNEL_BACKOFF && nearest > backoff_tolerance(bandwidth))
		{
			values[3] = Int32GetDatum(checked_int4(floor(log(float8_div(nearest, bandwidth)) / log(decay))));
			nulls[3] = false;
		}
		if (kernel == KERNEL_BACKOFF)
			backoff_cut(terms, &n, bandwidth, decay);
	}
	checked_sort(terms, n, sizeof(Term), term_order);
	cands = token_logits(terms, n, &n_cands);
	if (n > 0)
	{
		double		top_c = terms[0].c, total = 0, by_source[3] = {0, 0, 0}, lse;
		double		top_z = cands[0].z, sum = 0, pmax = 0, h = 0;
		double	   *ps = palloc(sizeof(double) * n_cands);
		int32	   *ids = palloc(sizeof(int32) * n_cands);

		/* the matched mass and its shares: stored, history, memory */
		for (int i = 1; i < n; i++)
			top_c = fmax(top_c, terms[i].c);
		for (int i = 0; i < n; i++)
		{
			double		e = terms[i].c - top_c < LSE_CUTOFF ? 0.0 : exp(terms[i].c - top_c);

			total += e;
			by_source[terms[i].hist ? 1 : terms[i].mem ? 2 : 0] += e;
		}
		lse = top_c + log(total);
		values[4] = Float8GetDatum(lse < LSE_CUTOFF ? 0.0 : exp(lse));
		values[5] = Int32GetDatum(n);
		for (int s = 0; s < 3; s++)
		{
			values[8 + s] = Float8GetDatum(by_source[s] / total);
			nulls[8 + s] = false;
		}
		/* next_token's softmax at T = 1 over the per-token logits (ids ascending) */
		for (int i = 1; i < n_cands; i++)
			top_z = fmax(top_z, cands[i].z);
		for (int i = 0; i < n_cands; i++)
		{
			ps[i] = cands[i].z - top_z < SOFTMAX_CUTOFF ? 0.0 : exp(cands[i].z - top_z);
			sum += ps[i];
		}
		for (int i = 0; i < n_cands; i++)
		{
			ids[i] = cands[i].tid;
			ps[i] /= sum;
			pmax = fmax(pmax, ps[i]);
			if (ps[i] > 0)
				h -= ps[i] * log(ps[i]);
		}
		values[0] = PointerGetDatum(int4_array(ids, n_cands));
		values[1] = PointerGetDatum(float8_array(ps, n_cands));
		values[6] = Float8GetDatum(pmax);
		values[7] = Float8GetDatum(h);
		nulls[6] = nulls[7] = false;
	}
	else
	{
		values[0] = PointerGetDatum(int4_array(NULL, 0));
		values[1] = PointerGetDatum(float8_array(NULL, 0));
	}
	nulls[0] = nulls[1] = false;
	pfree(terms);
	pfree(cands);
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
/* htk_next_token: the whole step in C for the rows layout                                   */
/* ---------------------------------------------------------------------------------------- */

/*
 * A backend-local cache of atom sets' token positions, so a step looks every context token up in
 * memory: the set's token_blocks rows are read once, into one array of x, y, z per token id (NaN:
 * no such token). An entry belongs to one version of the set's atom_sets row (xmin, ctid), read
 * on every call whose snapshot may see another one: a set deleted and rebuilt under the same id (a
 * sequence restarted, the extension re-created) is a new row version and is read again. A loop's
 * steps (generate_tokens, draft_tokens) take one snapshot after another in which no transaction
 * ended and this one changed nothing: those see the row version the last read found, so they do
 * not read it again (what_changed). A set without token_blocks or of
 * the tiles layout is not served (the SQL path serves it), nor one whose positions exceed
 * max_state_memory. Eight sets at most, the least recently used dropped.
 */
#define CACHE_SETS 8
#define TOKEN_BLOCK 256
#define MAX_BLOCK 8388607		/* (2^31 - 1) / 256: the block of the largest token id */

/* One version of an atom_sets row: what a cached set and a context state belong to. */
typedef struct
{
	int32		id;				/* 0: none */
	TransactionId xmin;
	ItemPointerData ctid;
} SetVersion;

typedef struct
{
	SetVersion	set;
	bool		served;			/* rows layout with token_blocks, within the bound */
	int			refused_kb;		/* not served for its size under this max_state_memory (else 0) */
	int32		slots;			/* token ids 0 .. slots - 1 */
	double	   *xyz;			/* 3 * slots, in TopMemoryContext */
	uint64		used;			/* LRU clock */
	uint64		seen_ends;		/* the snapshot the version was read under: transactions ended */
	CommandId	seen_cid;		/* and its command id (this transaction's own changes) */
} PositionCache;

static PositionCache cache[CACHE_SETS];
static uint64 lru_clock = 0;	/* one clock for cached sets and context states */
static uint64 evictions = 0;

static bool
same_version(const SetVersion *a, const SetVersion *b)
{
	return a->id == b->id && a->xmin == b->xmin && ItemPointerEquals((ItemPointer) &a->ctid, (ItemPointer) &b->ctid);
}

static void trim_kept(Size limit, const PositionCache *pin_set, const void *pin_state);

/*
 * Whether the active snapshot may see another version of the set's row than the one read under
 * the snapshot slot->seen_*: true unless a transaction ended since (PostgreSQL counts them in
 * snapXactCompletionCount; 0 where it does not) and this transaction changed nothing (the command
 * id). Reading the version through SPI costs a query per step; this costs a comparison.
 */
static bool
what_changed(const PositionCache *slot)
{
	Snapshot	snap = ActiveSnapshotSet() ? GetActiveSnapshot() : NULL;

	return snap == NULL || snap->snapXactCompletionCount == 0
		|| snap->snapXactCompletionCount != slot->seen_ends || snap->curcid != slot->seen_cid;
}

/* Record the active snapshot as the one the slot's version was read under. */
static void
seen_under(PositionCache *slot)
{
	Snapshot	snap = ActiveSnapshotSet() ? GetActiveSnapshot() : NULL;

	slot->seen_ends = snap != NULL ? snap->snapXactCompletionCount : 0;
	slot->seen_cid = snap != NULL ? snap->curcid : InvalidCommandId;
}

/* The version of atom set set_id's row and whether its layout is rows; false: no such set. Inside SPI. */
static SPIPlanPtr set_version_plan = NULL;

static bool
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
static void
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
 * The cached positions of atom set set_id (its row's version read here unless `known` gives it);
 * NULL where the native steps do not serve the set (no such set, the tiles layout, no
 * token_blocks, too large). Inside SPI.
 */
static PositionCache *
cached_set(int32 set_id, const SetVersion *known, bool known_rows)
{
	PositionCache *slot = NULL;
	SetVersion	v;
	bool		rows = known_rows;

	if (known == NULL)
		for (int i = 0; i < CACHE_SETS; i++)
			if (cache[i].set.id == set_id && cache[i].served && !what_changed(&cache[i]))
			{
				cache[i].used = ++lru_clock;
				return &cache[i];	/* the version read last is the one this snapshot sees */
			}
	if (known != NULL)
		v = *known;
	else if (!read_set_version(set_id, &v, &rows))
		return NULL;
	if (!rows)
		return NULL;
	for (int i = 0; i < CACHE_SETS; i++)
		if (cache[i].set.id == set_id)
		{
			if (same_version(&cache[i].set, &v) && (cache[i].refused_kb == 0 || cache[i].refused_kb == max_state_kb))
			{
				cache[i].used = ++lru_clock;
				seen_under(&cache[i]);
				return cache[i].served ? &cache[i] : NULL;
			}
			slot = &cache[i];	/* another version of the set (or another bound): read it again */
		}
	for (int i = 0; i < CACHE_SETS && slot == NULL; i++)
		if (cache[i].set.id == 0)
			slot = &cache[i];
	if (slot == NULL)
	{
		slot = &cache[0];		/* none free: the least recently used */
		for (int i = 1; i < CACHE_SETS; i++)
			if (cache[i].used < slot->used)
				slot = &cache[i];
	}
	if (slot->xyz != NULL)
		pfree(slot->xyz);
	memset(slot, 0, sizeof(*slot));
	/* set.id stays 0 until the slot is whole: an error half-way leaves a free slot */
	load_positions(slot, &v);
	slot->set = v;
	slot->used = ++lru_clock;
	seen_under(slot);
	return slot->served ? slot : NULL;
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
static uint64 knn_boundary_ties = 0;

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
	for (int i = 0; i < CACHE_SETS; i++)
		if (cache[i].set.id == set_id)
			current = &cache[i].set;
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
static void
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

/* ---------------------------------------------------------------------------------------- */
/* The context's state across steps, and exact pruning of the history atoms                 */
/* ---------------------------------------------------------------------------------------- */

/*
 * A generation's context changes by one token per step, so its keys are kept from one call to the
 * next: a backend-local state per (atom set, centroid window, decay) holds the last context's
 * tokens and the key of each of its prefixes (the key of prefix e is the centroid of its first e
 * tokens: for e = n the centre, for e < n the history atom of token e + 1). A call finds the state
 * whose tokens share the longest prefix with its context, drops what differs and computes the keys
 * of the new tokens only: O(window) each (O(1) with running sums for long windows). Four states,
 * the least recently used replaced, all of them with the cached positions within max_state_memory
 * (trim_kept); a context whose state alone would exceed it gets a state of its own call, dropped
 * with it. Nothing is stored in the database.
 *
 * The history atoms in the window are indexed by a uniform grid over their keys (a hash of cells,
 * chains linked both ways so that atoms leaving the window go in O(1)), so a step visits only the
 * cells within the pruning radius below; when that radius spans more cells than there are atoms
 * (wide kernels) every atom is scored, as before.
 */
#define STATE_SLOTS 4
#define STATE_MAX_TOKENS (1 << 20)	/* longer contexts take the SQL path; ~100 bytes a token */
/* A state's bytes per token: tokens, keys, running sums, cells, next, prev. */
#define STATE_TOKEN_BYTES (sizeof(int32) + 3 * sizeof(double) + 4 * sizeof(double) + 3 * sizeof(int64) \
						   + 2 * sizeof(int32))
#define GRID_BUCKETS 8192			/* twice the largest history window (4096) */
#define GRID_NONE (-1)

typedef struct
{
	SetVersion	set;			/* id 0: empty slot, or one being changed */
	bool		has_window;
	int			window;
	double		decay;
	double		ln_decay;
	int			reach;			/* elements with a non-zero weight; 0 = all */
	bool		running;		/* keys from running sums (reach 0 or > DIRECT_WINDOW) */
	double		d_w;			/* decay^reach: the weight of the element leaving the window */
	int			n;				/* tokens[0 .. n - 1]; keys of the prefixes 1 .. n */
	int			cap;
	int32	   *tokens;
	double	   *keys;			/* keys[3 (e - 1) ..]: the centroid of tokens[0 .. e - 1] */
	double	   *sums;			/* running: sx, sy, sz, sw after prefix e, at sums[4 (e - 1)] */
	/* The grid: history atoms lo .. hi - 1 (atom e: the key of prefix e, token tokens[e]). */
	double		cell;			/* cell size; 0: no grid (every atom is scored) */
	int			lo, hi;
	int64	   *cells;			/* 3 per atom */
	int32	   *next, *prev, *head;
	int			buckets;		/* a power of two */
	MemoryContext mcxt;
	uint64		used;
} ContextState;

static ContextState states[STATE_SLOTS];

/* What the native steps did in this session: htk_stats(). */
static struct
{
	uint64		steps;
	uint64		keys_computed;
	uint64		history_scored;
	uint64		history_skipped;
	uint64		grid_steps;
} stats;

static uint32
cell_hash(int64 x, int64 y, int64 z)
{
	uint64		h = (uint64) x * UINT64CONST(0x9E3779B97F4A7C15) ^ (uint64) y * UINT64CONST(0xC2B2AE3D27D4EB4F)
		^ (uint64) z * UINT64CONST(0x165667B19E3779F9);

	return (uint32) (h ^ (h >> 29) ^ (h >> 47));
}

/* The cell of a coordinate, or false where the grid cannot hold it (then there is no grid). */
static bool
cell_of(double v, double cell, int64 *out)
{
	double		c = floor(v / cell);

	if (!(c > -4.0e15 && c < 4.0e15))
		return false;
	*out = (int64) c;
	return true;
}

static void
grid_unlink(ContextState *st, int e)
{
	int64	   *c = st->cells + 3 * e;
	uint32		b = cell_hash(c[0], c[1], c[2]) & (st->buckets - 1);

	if (st->prev[e] != GRID_NONE)
		st->next[st->prev[e]] = st->next[e];
	else
		st->head[b] = st->next[e];
	if (st->next[e] != GRID_NONE)
		st->prev[st->next[e]] = st->prev[e];
}

static bool
grid_link(ContextState *st, int e)
{
	const double *key = st->keys + 3 * (e - 1);
	int64	   *c = st->cells + 3 * e;
	uint32		b;

	if (!cell_of(key[0], st->cell, &c[0]) || !cell_of(key[1], st->cell, &c[1])
		|| !cell_of(key[2], st->cell, &c[2]))
		return false;
	b = cell_hash(c[0], c[1], c[2]) & (st->buckets - 1);
	st->prev[e] = GRID_NONE;
	st->next[e] = st->head[b];
	if (st->head[b] != GRID_NONE)
		st->prev[st->head[b]] = e;
	st->head[b] = e;
	return true;
}

/* The context changed from token `keep` on: the atoms from there leave the grid. */
static void
grid_truncate(ContextState *st, int keep)
{
	if (st->cell <= 0)
		return;
	while (st->hi > st->lo && st->hi > keep)
		grid_unlink(st, --st->hi);
	if (st->lo > keep)
		st->lo = st->hi = keep;	/* empty (hi == lo): start again at the new end */
}

/* Make the grid hold exactly the history atoms lo .. n - 1 (false: the grid is off). */
static bool
grid_sync(ContextState *st, int lo)
{
	if (st->cell <= 0)
		return false;
	if (st->hi > st->n)
		grid_truncate(st, st->n);
	if (lo < st->lo)
	{
		/* The window reaches further back than the grid: link the atoms before it. */
		for (int e = lo; e < st->lo; e++)
			if (!grid_link(st, e))
			{
				st->cell = 0;
				return false;
			}
		st->lo = lo;
	}
	for (; st->lo < lo && st->lo < st->hi; st->lo++)
		grid_unlink(st, st->lo);
	if (st->lo < lo)
		st->lo = st->hi = lo;
	for (; st->hi < st->n; st->hi++)
		if (!grid_link(st, st->hi))
		{
			st->cell = 0;
			return false;
		}
	return true;
}

static void
state_reset(ContextState *st)
{
	if (st->mcxt != NULL)
		MemoryContextDelete(st->mcxt);
	memset(st, 0, sizeof(*st));
}

/* What a state for n tokens may take: the grid's buckets, the arrays at twice n (they double), blocks. */
static Size
state_estimate(int n)
{
	return GRID_BUCKETS * sizeof(int32) + 2 * (Size) n * STATE_TOKEN_BYTES + 4 * ALLOCSET_DEFAULT_INITSIZE;
}

/* The memory kept between calls: cached positions and context states (htk_stats' kept_bytes). */
static Size
kept_bytes(int *sets, int *contexts)
{
	Size		total = 0;

	*sets = *contexts = 0;
	for (int i = 0; i < CACHE_SETS; i++)
		if (cache[i].xyz != NULL)
		{
			total += GetMemoryChunkSpace(cache[i].xyz);
			(*sets)++;
		}
	for (int i = 0; i < STATE_SLOTS; i++)
		if (states[i].mcxt != NULL)
		{
			total += MemoryContextMemAllocated(states[i].mcxt, true);
			(*contexts)++;
		}
	return total;
}

/*
 * Drop the least recently used cached positions and context states, but not the pinned ones,
 * until what is kept fits in `limit` bytes.
 */
static void
trim_kept(Size limit, const PositionCache *pin_set, const void *pin_state)
{
	int			sets, contexts;

	while (kept_bytes(&sets, &contexts) > limit)
	{
		PositionCache *set = NULL;
		ContextState *st = NULL;
		uint64		oldest = PG_UINT64_MAX;

		for (int i = 0; i < CACHE_SETS; i++)
			if (cache[i].xyz != NULL && &cache[i] != pin_set && cache[i].used < oldest)
			{
				set = &cache[i];
				oldest = set->used;
			}
		for (int i = 0; i < STATE_SLOTS; i++)
			if (states[i].mcxt != NULL && (const void *) &states[i] != pin_state && states[i].used < oldest)
			{
				st = &states[i];
				oldest = st->used;
			}
		if (st != NULL)
			state_reset(st);
		else if (set != NULL)
		{
			pfree(set->xyz);
			memset(set, 0, sizeof(*set));
		}
		else
			return;				/* only the pinned ones are left */
		evictions++;
	}
}

/* An empty state for these key parameters, its memory under `parent`. */
static void
state_init(ContextState *st, MemoryContext parent, bool has_window, int window, double decay, double cell)
{
	memset(st, 0, sizeof(*st));
	st->mcxt = AllocSetContextCreate(parent, "hartonomous_kernel context state", ALLOCSET_DEFAULT_SIZES);
	st->has_window = has_window;
	st->window = window;
	st->decay = decay;
	st->ln_decay = log(decay);
	st->reach = has_window ? window : 0;
	if (st->ln_decay < 0.0)
	{
		double		k = floor(300.0 / -st->ln_decay) + 1.0;

		if (st->reach == 0 || k < st->reach)
			st->reach = k > INT_MAX ? INT_MAX : (int) k;
	}
	st->running = st->reach == 0 || st->reach > DIRECT_WINDOW;
	st->d_w = st->reach > 0 ? pow(decay, (double) st->reach) : 0.0;
	st->cell = cell > 0 && isfinite(cell) ? cell : 0;
	st->head = MemoryContextAlloc(st->mcxt, sizeof(int32) * GRID_BUCKETS);
	st->buckets = GRID_BUCKETS;
	for (int b = 0; b < GRID_BUCKETS; b++)
		st->head[b] = GRID_NONE;
}

/*
 * Room for `cap` tokens: the arrays grow by doubling (repalloc keeps them and the grid's links);
 * the running sums only where the keys use them. The grid's buckets are allocated with the slot.
 */
static void
state_reserve(ContextState *st, int cap)
{
	if (cap <= st->cap)
		return;
	if (cap < 2 * st->cap)
		cap = 2 * st->cap;
	if (st->tokens == NULL)
	{
		st->tokens = MemoryContextAlloc(st->mcxt, sizeof(int32) * cap);
		st->keys = MemoryContextAlloc(st->mcxt, sizeof(double) * 3 * cap);
		if (st->running)
			st->sums = MemoryContextAlloc(st->mcxt, sizeof(double) * 4 * cap);
		st->cells = MemoryContextAlloc(st->mcxt, sizeof(int64) * 3 * (cap + 1));
		st->next = MemoryContextAlloc(st->mcxt, sizeof(int32) * (cap + 1));
		st->prev = MemoryContextAlloc(st->mcxt, sizeof(int32) * (cap + 1));
	}
	else
	{
		st->tokens = repalloc(st->tokens, sizeof(int32) * cap);
		st->keys = repalloc(st->keys, sizeof(double) * 3 * cap);
		if (st->running)
			st->sums = repalloc(st->sums, sizeof(double) * 4 * cap);
		st->cells = repalloc(st->cells, sizeof(int64) * 3 * (cap + 1));
		st->next = repalloc(st->next, sizeof(int32) * (cap + 1));
		st->prev = repalloc(st->prev, sizeof(int32) * (cap + 1));
	}
	st->cap = cap;
}

/*
 * The key of prefix e (its first e tokens) from the keys' definition (compute_keys): direct
 * weighted sums over the last `reach` tokens, or the running sums from prefix e - 1.
 */
static bool
state_push(ContextState *st, const PositionCache *pos, int32 token)
{
	int			e = st->n + 1;
	double	   *key;

	if (token < 0 || token >= pos->slots || isnan(pos->xyz[3 * token]))
		return false;
	state_reserve(st, e);
	st->tokens[e - 1] = token;
	key = st->keys + 3 * (e - 1);
	if (!st->running)
	{
		double		sx = 0, sy = 0, sz = 0, sw = 0;
		int			first = st->reach > 0 && e - st->reach > 0 ? e - st->reach : 0;

		for (int j = first; j < e; j++)
		{
			double		w = weight_at(e - 1 - j, st->has_window, st->window, st->decay, st->ln_decay);
			const double *p = pos->xyz + 3 * (j == e - 1 ? token : st->tokens[j]);

			sx += w * p[0];
			sy += w * p[1];
			sz += w * p[2];
			sw += w;
		}
		key[0] = sx / sw;
		key[1] = sy / sw;
		key[2] = sz / sw;
	}
	else
	{
		double	   *s = st->sums + 4 * (e - 1);
		const double *before = e > 1 ? st->sums + 4 * (e - 2) : NULL;
		const double *p = pos->xyz + 3 * token;

		for (int a = 0; a < 3; a++)
			s[a] = (before ? st->decay * before[a] : 0.0) + p[a];
		s[3] = (before ? st->decay * before[3] : 0.0) + 1.0;
		if (st->reach > 0 && e - st->reach >= 1)
		{
			const double *o = pos->xyz + 3 * st->tokens[e - st->reach - 1];

			for (int a = 0; a < 3; a++)
				s[a] -= st->d_w * o[a];
			s[3] -= st->d_w;
		}
		key[0] = s[0] / s[3];
		key[1] = s[1] / s[3];
		key[2] = s[2] / s[3];
	}
	st->n = e;
	stats.keys_computed++;
	return true;
}

/*
 * The state for this context, its keys up to date. The kept context of the same set version and key
 * parameters sharing the longest prefix with it is extended (a generation growing) or cut back
 * first (a rejected draft) when that prefix is at least half of it; otherwise (another prompt) the
 * least recently used slot is emptied and filled, the others trimmed to leave it room. A context
 * whose state would not fit in max_state_memory gets `scratch`, under the current memory context
 * (the caller deletes it). NULL when a context token is not in the set (the state then ends before
 * it) or the context is longer than STATE_MAX_TOKENS (the caller takes the SQL path). While a slot
 * changes it matches nothing (set id 0), so an error half-way (out of memory, a cancel) leaves a
 * slot that is emptied when it is next taken, never a half-updated one.
 */
static ContextState *
context_state(const PositionCache *pos, bool has_window, int window, double decay, const int32 *ctx,
			  int n_ctx, double cell, ContextState *scratch)
{
	ContextState *st = NULL;
	int			best = -1;
	Size		need = state_estimate(n_ctx);

	if (n_ctx > STATE_MAX_TOKENS)
		return NULL;
	if (need > state_limit())
	{
		st = scratch;
		state_init(st, CurrentMemoryContext, has_window, window, decay, cell);
		best = 0;
	}
	else
	{
		for (int i = 0; i < STATE_SLOTS; i++)
		{
			ContextState *s = &states[i];
			int			common = 0;

			if (!same_version(&s->set, &pos->set) || s->has_window != has_window || s->window != window
				|| s->decay != decay)
				continue;
			while (common < s->n && common < n_ctx && s->tokens[common] == ctx[common])
				common++;
			if (common > best)
			{
				best = common;
				st = s;
			}
		}
		if (st != NULL && 2 * best < st->n)
			st = NULL;			/* another prompt: that one stays for its own next call */
		if (st == NULL)
		{
			for (int i = 0; i < STATE_SLOTS; i++)
				if (st == NULL || (st->mcxt != NULL && (states[i].mcxt == NULL || states[i].used < st->used)))
					st = &states[i];
			state_reset(st);
			state_init(st, TopMemoryContext, has_window, window, decay, cell);
			best = 0;
		}
		else
			st->set.id = 0;		/* matches nothing until it is consistent again */
		st->used = ++lru_clock;
		trim_kept(state_limit() - need, pos, st);	/* room for this one */
	}
	if (best < st->n)
	{
		st->n = best;			/* the context differs from here on */
		grid_truncate(st, best);
	}
	while (st->n < n_ctx)
	{
		if ((st->n & 0xFFF) == 0)
			CHECK_FOR_INTERRUPTS();
		if (!state_push(st, pos, ctx[st->n]))
		{
			st->set = pos->set;	/* consistent: it ends before the foreign token */
			return NULL;
		}
	}
	st->set = pos->set;
	return st;
}

/*
 * The grid's cell size for a set: about the pruning reach at T = 1 (a kernel value of ~1,500
 * between the step's best term and the cut), so a step visits the 27 cells around the centre.
 */
static double
grid_cell(bool gaussian, double bandwidth)
{
	return bandwidth * (gaussian ? sqrt(1500.0) : 1500.0);
}

/* History atom e's term, appended to terms[*n] when it lies within the reach: 1 if so, else 0. */
static int
history_term(const ContextState *st, int e, const double *center, double reach, double ln_w, bool gaussian,
			 double bandwidth, Term *terms, int *n)
{
	const double *key = st->keys + 3 * (e - 1);
	double		dx = key[0] - center[0], dy = key[1] - center[1], dz = key[2] - center[2];
	double		d = sqrt(dx * dx + dy * dy + dz * dz);

	if (!(d <= reach))
		return 0;				/* pruned (or beyond search_radius) */
	terms[*n].tid = st->tokens[e];
	terms[*n].c = ln_w - kernel_term(d, gaussian ? KERNEL_GAUSSIAN : KERNEL_EXPONENTIAL, bandwidth);
	terms[*n].d = d;
	terms[*n].hist = true;
	terms[*n].mem = false;
	(*n)++;
	return 1;
}

/*
 * The history atoms' kernel terms for a step, pruned exactly (prune_reach): the atoms within the
 * reach are found through the grid, or, where the reach spans more cells than there are atoms,
 * by scoring every one. Either way the same atoms are kept. Appends to terms[*n].
 */
static void
history_terms(ContextState *st, int m, const double *center, bool gaussian, double bandwidth,
			  double history_weight, bool has_radius, double radius, double z_lb, int n_stored,
			  double temperature, double penalty, Term *terms, int *n)
{
	double		ln_w = log(history_weight);
	int			from = st->n - m;	/* history atoms from .. n - 1 */
	double		reach = prune_reach(z_lb, temperature, penalty, n_stored, m, gaussian, bandwidth,
									history_weight, has_radius, radius);
	int			scored = 0;
	bool		grid;

	grid = isfinite(reach) && grid_sync(st, from);
	if (grid)
	{
		int64		lo[3], hi[3];
		double		cells = 1;

		for (int a = 0; a < 3 && grid; a++)
		{
			/* the cells one rounding error wider than the ball: an atom at d == reach is found */
			double		r = reach + 4 * DBL_EPSILON * (fabs(center[a]) + reach);

			grid = cell_of(center[a] - r, st->cell, &lo[a]) && cell_of(center[a] + r, st->cell, &hi[a]);
			cells *= grid ? (double) (hi[a] - lo[a] + 1) : 0;
		}
		if (grid && cells <= m)
		{
			stats.grid_steps++;
			for (int64 x = lo[0]; x <= hi[0]; x++)
				for (int64 y = lo[1]; y <= hi[1]; y++)
					for (int64 z = lo[2]; z <= hi[2]; z++)
						for (int e = st->head[cell_hash(x, y, z) & (st->buckets - 1)]; e != GRID_NONE; e = st->next[e])
						{
							const int64 *c = st->cells + 3 * e;

							if (c[0] == x && c[1] == y && c[2] == z)	/* else another cell in this bucket */
								scored += history_term(st, e, center, reach, ln_w, gaussian, bandwidth, terms, n);
						}
			stats.history_scored += scored;
			stats.history_skipped += m - scored;
			return;
		}
	}
	for (int e = from; e < st->n; e++)
		scored += history_term(st, e, center, reach, ln_w, gaussian, bandwidth, terms, n);
	stats.history_scored += scored;
	stats.history_skipped += m - scored;
}

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
 * The backoff kernel's terms (hartonomous/kernel.py): every candidate scores ln(weight), and only
 * those within the nearest candidate's radius count. The stored terms come in scored by
 * stored_terms (one per KNN row, ln(weight)); the history atoms are scored here, all of them (no
 * pruning: the radius depends on the nearest of them), then backoff_cut keeps the radius.
 */
static void
backoff_terms(const ContextState *st, int m, const double *center, double decay, double bandwidth,
			  double history_weight, bool has_radius, double radius, Term *terms, int *n)
{
	for (int e = st->n - m; e < st->n && m > 0; e++)
	{
		const double *key = st->keys + 3 * (e - 1);
		double		dx = key[0] - center[0], dy = key[1] - center[1], dz = key[2] - center[2];
		double		d = sqrt(dx * dx + dy * dy + dz * dz);

		CHECK_FOR_INTERRUPTS();
		if (has_radius && !(d <= radius))
			continue;
		terms[*n].tid = st->tokens[e];
		terms[*n].c = log(history_weight);
		terms[*n].d = d;
		terms[*n].hist = true;
		terms[*n].mem = false;
		(*n)++;
	}
	stats.history_scored += m;
	backoff_cut(terms, n, bandwidth, decay);
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
	stats.steps++;
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
 * next_token in one C call where it can serve it: htk_step(context, temperature, top_k, top_p,
 * search_radius, max_neighbors, atom_set, repetition_penalty, history_weight, history_window) ->
 * (token_ids, probabilities, cumulative), next_token's own arguments. It reads the atom set's row
 * itself and serves only arguments next_token accepts, for a set of the rows layout whose every
 * context token it holds; NULL otherwise, and next_token then takes its checked path, whose
 * messages (SQLSTATE 22023 naming the argument) stay the one source of what bad input is told.
 */
static SPIPlanPtr set_by_name_plan = NULL;
static SPIPlanPtr default_set_plan = NULL;

/*
 * The 8th column: whether the set's kernel is the backoff kernel (next_token's C step has all
 * three); then the row's version and whether its layout is rows (cached_set's).
 */
#define SET_COLUMNS "SELECT s.id, s.centroid_window, s.centroid_decay, s.kernel = 'gaussian', s.bandwidth," \
	" s.history_weight, s.history_window, s.kernel = 'backoff', s.xmin, s.ctid," \
	" s.layout IS DISTINCT FROM 'tiles' FROM atom_sets s"

/* An atom set's row as the C steps read it (ht_atom_set's values, before the caller's overrides). */
typedef struct
{
	SetVersion	version;
	bool		has_window;
	int			window;
	double		decay;
	Kernel		kernel;
	double		bandwidth;
	double		history_weight;
	int			history;
	bool		rows;			/* the rows layout */
} SetRow;

/*
 * The atom set named by argument `name_arg` of fcinfo (NULL: the default one), as ht_atom_set reads
 * it; false where there is not exactly one. Inside SPI.
 */
static bool
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
	values[0] = Int64GetDatum((int64) stats.steps);
	values[1] = Int64GetDatum((int64) stats.keys_computed);
	values[2] = Int64GetDatum((int64) stats.history_scored);
	values[3] = Int64GetDatum((int64) stats.history_skipped);
	values[4] = Int64GetDatum((int64) stats.grid_steps);
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
/* htk_pick                                                                                 */
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
