/*
 * The kernel arithmetic: each function the C form of a PL/pgSQL reference in sql/ (results agree
 * with it to rounding). Pure functions over arrays; no table access, no state kept.
 */
#include "hartonomous_kernel.h"

void
raise_bad(const char *message)
{
	ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("%s", message)));
}

ArrayType *
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

ArrayType *
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
int
checked_cmp(const void *a, const void *b, void *arg)
{
	static uint32 ticks = 0;

	if ((++ticks & 0xFFFF) == 0)
		CHECK_FOR_INTERRUPTS();
	return ((int (*) (const void *, const void *)) arg) (a, b);
}

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
/* The context's keys (htk_keys)                                                            */
/* ---------------------------------------------------------------------------------------- */

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
double *
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

/* ---------------------------------------------------------------------------------------- */
/* Kernel terms, per-token log-sum-exp and the sampler (htk_distribution)                   */
/* ---------------------------------------------------------------------------------------- */

/*
 * Token id, then the term: a canonical order up to equal values, so a token's log-sum-exp is the
 * same bits whatever order the KNN or the history gave its terms in (both layouts, the grid).
 */
int
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
double
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
void
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
double
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

/*
 * The stored atoms' kernel terms, ln(weight) - kernel(distance / h), of the KNN rows within
 * search_radius, appended to terms; with `prune`, returns the lower bound of the step's largest
 * scaled logit that prune_reach starts from (else -infinity).
 */
double
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
Datum
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
Datum
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

/* ---------------------------------------------------------------------------------------- */
/* Raw logits and the step's signals (htk_logits)                                           */
/* ---------------------------------------------------------------------------------------- */

/* htk_logits' record for checked inputs: the raw logits and the signals from every term (no pruning). */
Datum
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

/* ---------------------------------------------------------------------------------------- */
/* store_distribution's row (htk_store)                                                     */
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
void
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
