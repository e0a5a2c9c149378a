/*
 * The per-backend state (TopMemoryContext), kept between calls within
 * hartonomous_kernel.max_state_memory: the token positions of up to CACHE_SETS atom sets and the
 * keys of up to STATE_SLOTS contexts, each keyed by its set's row version; the grid over a
 * context's history keys that exact pruning visits; the session's counters (htk_stats).
 */
#include "hartonomous_kernel.h"

/* hartonomous_kernel.max_state_memory, in kB: what a backend keeps between calls (hartonomous_kernel.c's header). */
int			max_state_kb = 65536;

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

Size
state_limit(void)
{
	return (Size) max_state_kb * 1024;
}

/* ---------------------------------------------------------------------------------------- */
/* The position cache                                                                       */
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
static PositionCache cache[CACHE_SETS];
static uint64 lru_clock = 0;	/* one clock for cached sets and context states */
uint64		evictions = 0;

bool
same_version(const SetVersion *a, const SetVersion *b)
{
	return a->id == b->id && a->xmin == b->xmin && ItemPointerEquals((ItemPointer) &a->ctid, (ItemPointer) &b->ctid);
}

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

/* The row version of atom set set_id whose positions are cached, or NULL (route_info's check). */
const SetVersion *
cached_version(int32 set_id)
{
	for (int i = 0; i < CACHE_SETS; i++)
		if (cache[i].set.id == set_id)
			return &cache[i].set;
	return NULL;
}

/*
 * The cached positions of atom set set_id (its row's version read here unless `known` gives it);
 * NULL where the native steps do not serve the set (no such set, the tiles layout, no
 * token_blocks, too large). Inside SPI.
 */
PositionCache *
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
static ContextState states[STATE_SLOTS];

/* What the native steps did in this session: htk_stats(). */
StepStats	step_stats;

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
Size
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
void
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
	step_stats.keys_computed++;
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
ContextState *
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
double
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
void
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
			step_stats.grid_steps++;
			for (int64 x = lo[0]; x <= hi[0]; x++)
				for (int64 y = lo[1]; y <= hi[1]; y++)
					for (int64 z = lo[2]; z <= hi[2]; z++)
						for (int e = st->head[cell_hash(x, y, z) & (st->buckets - 1)]; e != GRID_NONE; e = st->next[e])
						{
							const int64 *c = st->cells + 3 * e;

							if (c[0] == x && c[1] == y && c[2] == z)	/* else another cell in this bucket */
								scored += history_term(st, e, center, reach, ln_w, gaussian, bandwidth, terms, n);
						}
			step_stats.history_scored += scored;
			step_stats.history_skipped += m - scored;
			return;
		}
	}
	for (int e = from; e < st->n; e++)
		scored += history_term(st, e, center, reach, ln_w, gaussian, bandwidth, terms, n);
	step_stats.history_scored += scored;
	step_stats.history_skipped += m - scored;
}

/*
 * The backoff kernel's terms (hartonomous/kernel.py): every candidate scores ln(weight), and only
 * those within the nearest candidate's radius count. The stored terms come in scored by
 * stored_terms (one per KNN row, ln(weight)); the history atoms are scored here, all of them (no
 * pruning: the radius depends on the nearest of them), then backoff_cut keeps the radius.
 */
void
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
	step_stats.history_scored += m;
	backoff_cut(terms, n, bandwidth, decay);
}
