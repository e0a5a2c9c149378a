/*
 * hartonomous_kernel.h: what the kernel's source files share. The files follow the sections the
 * kernel had as one file (as pgvector splits its sources, one header and an object per file):
 *
 *   hartonomous_kernel.c  the entry points: every htk_* function, its arguments checked, and one
 *                         next_token step in C (native_step)
 *   arithmetic.c          the kernel arithmetic: keys, kernel terms, the backoff ladder, the exact
 *                         pruning bound, per-token log-sum-exp, the sampler, store_distribution's row
 *   knn.c                 the KNN and SPI: a set's row version, token_blocks and row, the prepared
 *                         KNN (ht_knn's rows) and its routing on Citus
 *   state.c               the per-backend state: max_state_memory, the position cache, the context
 *                         states and their grid over the history keys
 *
 * The functions and variables shared between the files are declared here with hidden visibility:
 * the library exports the SQL-callable functions only, so none of these names can meet a
 * function of the server or of another extension loaded into the same backend.
 */
#ifndef HARTONOMOUS_KERNEL_H
#define HARTONOMOUS_KERNEL_H

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

/* Direct windowed sums up to this many elements per key; longer windows use the recursion. */
#define DIRECT_WINDOW 64
/* exp() below these exponents counts as 0, as in the PL/pgSQL reference. */
#define LSE_CUTOFF (-744.0)
#define SOFTMAX_CUTOFF (-700.0)

/* Bad arguments: SQLSTATE 22023, the message naming the argument as the SQL functions do. */
#define BAD_ARG(...) ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg(__VA_ARGS__)))

/* The limits of next_token's arguments (ht_check_sampler_args, sql/020_next_token.sql). */
#define MAX_NEIGHBORS 100000
#define MAX_HISTORY_WINDOW 4096

/* The kernels of atom_sets.kernel. */
typedef enum
{
	KERNEL_GAUSSIAN,
	KERNEL_EXPONENTIAL,
	KERNEL_BACKOFF
} Kernel;

/* One candidate's kernel term: a stored atom (a KNN row) or a history atom. */
typedef struct
{
	int32		tid;
	double		c;				/* ln(weight) - kernel(distance / bandwidth) */
	double		d;				/* the distance to the centroid */
	bool		hist;			/* a history atom (else a stored KNN row) */
	bool		mem;			/* a KNN row from the memory of past generations (htk_store only) */
} Term;

/* One token's row in the sampler. */
typedef struct
{
	int32		tid;
	double		z;				/* the scaled logit */
	double		e;				/* exp(dz) of the current stage */
	double		p;
} Cand;

/* The sampler's arguments, for pruning (NULL: every term is kept, as for the signals). */
typedef struct
{
	double		temperature;
	double		penalty;
} Pruning;

/* The position cache (state.c): eight sets at most, token_blocks of 256 tokens. */
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

/* The context states (state.c). */
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

/* What the native steps did in this session: htk_stats(). */
typedef struct
{
	uint64		steps;
	uint64		keys_computed;
	uint64		history_scored;
	uint64		history_skipped;
	uint64		grid_steps;
} StepStats;

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

/* The kernel arithmetic's two per-atom functions, inline where the steps call them (every file). */

/*
 * The weight of the element k steps back from a prefix's newest one (k = 0: the newest), as the
 * reference defines it: 0 outside the window, 1 without decay, 0 where k ln(decay) < -300.
 */
static inline double
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

/*
 * (d / h)^2, d / h, or 0 for the backoff kernel (its candidates score ln(weight) inside the radius:
 * backoff_cut); x * x is pow(x, 2) exactly (both correctly rounded), and cheaper. Overflow and
 * underflow raise 22003, as the reference's (d / h) ^ 2 does (distances 1e10 at bandwidth 1e-150).
 */
static inline double
kernel_term(double d, Kernel kernel, double bandwidth)
{
	double		x;

	if (kernel == KERNEL_BACKOFF)
		return 0.0;
	x = float8_div(d, bandwidth);
	return kernel == KERNEL_GAUSSIAN ? float8_mul(x, x) : x;
}

/* qsort with a cancel check every 2^16 comparisons (arithmetic.c, checked_cmp). */
#define checked_sort(base, n, size, cmp) qsort_arg((base), (n), (size), checked_cmp, (void *) (cmp))

#pragma GCC visibility push(hidden)

/* arithmetic.c: the kernel arithmetic */
extern void raise_bad(const char *message);
extern ArrayType *float8_array(const double *v, int n);
extern ArrayType *int4_array(const int32 *v, int n);
extern int	checked_cmp(const void *a, const void *b, void *arg);
extern double *compute_keys(const double *xyz, int n, bool has_window, int window, double decay, int history,
							int *m_out);
extern int	term_order(const void *a, const void *b);
extern double backoff_radius(double nearest, double bandwidth, double decay);
extern void backoff_cut(Term *terms, int *n, double bandwidth, double decay);
extern double prune_reach(double z_lb, double temperature, double penalty, int n_stored, int m, bool gaussian,
						  double bandwidth, double history_weight, bool has_radius, double radius);
extern double stored_terms(const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn,
						   Kernel kernel, double bandwidth, bool has_radius, double radius, const Pruning *prune,
						   Term *terms, int *n);
extern Datum terms_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, Term *terms, int n_terms,
						  double temperature, bool has_top_k, int top_k, bool has_top_p, double top_p,
						  double penalty);
extern Datum rows_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, const double *keys, int m,
						 const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn, Kernel kernel,
						 double bandwidth, double decay, double history_weight, bool has_radius, double radius,
						 double temperature, bool has_top_k, int top_k, bool has_top_p, double top_p,
						 double penalty);
extern Datum logits_record(FunctionCallInfo fcinfo, const int32 *ctx, int n_ctx, const double *keys, int m,
						   const int32 *knn_ids, const double *knn_w, const double *knn_d, int n_knn,
						   Kernel kernel, double bandwidth, double decay, double history_weight,
						   bool has_radius, double radius);
extern void store_row(const int32 *ctx, int n_ctx, const double *center, const double *hist, int m,
					  const int32 *knn_ids, const double *knn_w, const double *knn_d, const bool *knn_mem,
					  int n_knn, Kernel kernel, double bandwidth, double decay, double history_weight,
					  Datum *values, bool *nulls);

/* knn.c: the KNN and SPI (every function here runs inside SPI) */
extern uint64 knn_boundary_ties;
extern bool read_set_version(int32 set_id, SetVersion *v, bool *rows);
extern void load_positions(PositionCache *slot, const SetVersion *v);
extern void knn_rows(int32 set_id, const double *center, int k, bool has_radius, double radius,
					 int32 **ids, double **ws, double **ds, int *n);
extern bool read_set_row(FunctionCallInfo fcinfo, int name_arg, SetRow *s);

/* state.c: the per-backend state */
extern int	max_state_kb;
extern uint64 evictions;
extern StepStats step_stats;
extern Size state_limit(void);
extern bool same_version(const SetVersion *a, const SetVersion *b);
extern const SetVersion *cached_version(int32 set_id);
extern PositionCache *cached_set(int32 set_id, const SetVersion *known, bool known_rows);
extern Size kept_bytes(int *sets, int *contexts);
extern void trim_kept(Size limit, const PositionCache *pin_set, const void *pin_state);
extern ContextState *context_state(const PositionCache *pos, bool has_window, int window, double decay,
								   const int32 *ctx, int n_ctx, double cell, ContextState *scratch);
extern double grid_cell(bool gaussian, double bandwidth);
extern void history_terms(ContextState *st, int m, const double *center, bool gaussian, double bandwidth,
						  double history_weight, bool has_radius, double radius, double z_lb, int n_stored,
						  double temperature, double penalty, Term *terms, int *n);
extern void backoff_terms(const ContextState *st, int m, const double *center, double decay, double bandwidth,
						  double history_weight, bool has_radius, double radius, Term *terms, int *n);

#pragma GCC visibility pop

#endif							/* HARTONOMOUS_KERNEL_H */
