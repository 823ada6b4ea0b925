/*
 * cache.c
 *	  The per-session caches of sequences and counters by name: bounded by
 *	  sharded_seq.session_cache_size with least-recently-used eviction, and
 *	  remembered per call site (fn_extra) so a hot call finds its entry
 *	  without a hash lookup.
 */
#include "postgres.h"

#include "fmgr.h"
#include "nodes/primnodes.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "common/common.h"

int			SessionCacheSize = 25000;

/* What an fmgr call site remembers, so repeated calls skip the hash. */
typedef struct CallSite
{
	ObjectCache *cache;
	CacheEntry *entry;
	uint64		incarnation;	/* entry's, when remembered */
	bool		constant;		/* the name is a constant of the plan */
	int			len;
	char		name[NAMEDATALEN];
} CallSite;

/* a call site's fn_extra after one call that made no memo: matches no cache */
static CallSite SeenOnce;

/*
 * Is argument 0 a constant of the expression (a literal name, as in DEFAULT
 * sharded_nextval('orders_id'))?  Then every call of this call site passes
 * the same name.  Not a parameter: PL/pgSQL reuses a call site of a simple
 * expression with new parameter values.
 */
static bool
NameIsConstant(FmgrInfo *flinfo)
{
	Node	   *expr = flinfo->fn_expr;
	List	   *args;

	if (expr == NULL || !IsA(expr, FuncExpr))
		return false;
	args = ((FuncExpr *) expr)->args;
	return args != NIL && IsA(linitial(args), Const) && !((Const *) linitial(args))->constisnull;
}

/* Make entry the most recently used (it often is already). */
static inline void
Touch(ObjectCache *cache, CacheEntry *entry)
{
	if (dlist_head_node(&cache->lru) != &entry->lru)
		dlist_move_head(&cache->lru, &entry->lru);
}

/*
 * What cache entries own (privileges, remembered shard rows) lives in a
 * context of its own, not in TopMemoryContext: eviction frees it entry by
 * entry, so it is bounded like the caches, and it shows by name in
 * pg_backend_memory_contexts.
 */
MemoryContext
CacheEntryContext(void)
{
	static MemoryContext cxt = NULL;

	if (cxt == NULL)
		cxt = AllocSetContextCreate(TopMemoryContext, "sharded_seq cache entries",
									ALLOCSET_DEFAULT_SIZES);
	return cxt;
}

/*
 * The per-session caches of sequences and counters are bounded: past
 * sharded_seq.session_cache_size entries, the least recently used one is
 * evicted.  dynahash keeps a removed entry's memory for the next one, so a
 * cache never holds more than its bound, however many names a session uses.
 */
static void
EvictEntry(ObjectCache *cache, CacheEntry *entry)
{
	entry->incarnation = 0;		/* call sites that remember it will look again */
	if (cache->evict)
		cache->evict(entry);
	dlist_delete(&entry->lru);
	hash_search(cache->table, entry->name, HASH_REMOVE, NULL);
	cache->count--;
}

/*
 * The entry for name, made (zeroed but for its key, *is_new set) if absent.
 * It becomes the most recently used; making one may evict the least.
 */
CacheEntry *
CacheLookup(ObjectCache *cache, const char *name, bool *is_new)
{
	static uint64 incarnations = 0;
	char		key[NAMEDATALEN];
	CacheEntry *entry;
	bool		found;

	if (cache->table == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = NAMEDATALEN;
		ctl.entrysize = cache->entrysize;
		cache->table = hash_create(cache->label, 256, &ctl, HASH_ELEM | HASH_STRINGS);
		dlist_init(&cache->lru);
	}
	memset(key, 0, sizeof(key));
	strlcpy(key, name, sizeof(key));
	entry = hash_search(cache->table, key, HASH_ENTER, &found);
	*is_new = !found;
	if (found)
	{
		dlist_move_head(&cache->lru, &entry->lru);
		return entry;
	}
	memset((char *) entry + NAMEDATALEN, 0, cache->entrysize - NAMEDATALEN);
	entry->incarnation = ++incarnations;
	dlist_push_head(&cache->lru, &entry->lru);
	cache->count++;
	while (cache->count > SessionCacheSize)
		EvictEntry(cache, dlist_tail_element(CacheEntry, lru, &cache->lru));
	return entry;
}

/* CallSiteEntry, when the call site does not know the name yet */
static pg_noinline CacheEntry *
CallSiteLookup(FunctionCallInfo fcinfo, ObjectCache *cache, bool *is_new)
{
	CallSite   *cs = (CallSite *) fcinfo->flinfo->fn_extra;
	text	   *arg;
	int			len;
	char	   *name;
	CacheEntry *entry;

	if (PG_ARGISNULL(0))
		(void) NameArg(fcinfo, 0, cache->kind); /* raises */
	arg = PG_GETARG_TEXT_PP(0);
	len = VARSIZE_ANY_EXHDR(arg);
	if (cs && cs->cache == cache && cs->entry->incarnation == cs->incarnation &&
		cs->len == len && memcmp(cs->name, VARDATA_ANY(arg), len) == 0)
	{
		Touch(cache, cs->entry);
		return cs->entry;
	}

	/* the name the session looked up last is checked before the hash */
	entry = cache->last;
	if (entry && entry->incarnation == cache->last_incarnation && entry->incarnation != 0 &&
		len < NAMEDATALEN && entry->name[len] == '\0' &&
		memcmp(entry->name, VARDATA_ANY(arg), len) == 0)
	{
		Touch(cache, entry);
		name = NULL;
	}
	else
	{
		name = text_to_cstring(arg);
		ValidateName(name, cache->kind);
		entry = CacheLookup(cache, name, is_new);
		cache->last = entry;
		cache->last_incarnation = entry->incarnation;
	}
	if (cs == NULL || cs == &SeenOnce)
		cs = fcinfo->flinfo->fn_extra =
			MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(CallSite));
	cs->cache = cache;
	cs->entry = entry;
	cs->incarnation = entry->incarnation;
	cs->constant = NameIsConstant(fcinfo->flinfo);
	cs->len = len;
	memcpy(cs->name, VARDATA_ANY(arg), len);
	if (name)
		pfree(name);
	return entry;
}

/*
 * A new call site: a prepared statement's lives one execution, and most are
 * called once.  If the name is the one the session looked up last, the site
 * remembers nothing yet (SeenOnce); a second call makes its memo.
 */
static pg_noinline CacheEntry *
CallSiteFirst(FunctionCallInfo fcinfo, ObjectCache *cache, bool *is_new)
{
	if (!PG_ARGISNULL(0))
	{
		struct varlena *arg = (struct varlena *) DatumGetPointer(PG_GETARG_DATUM(0));
		CacheEntry *entry = cache->last;

		if (!VARATT_IS_EXTERNAL(arg) && !VARATT_IS_COMPRESSED(arg) && entry &&
			entry->incarnation == cache->last_incarnation && entry->incarnation != 0)
		{
			int			len = VARSIZE_ANY_EXHDR(arg);

			if (len < NAMEDATALEN && entry->name[len] == '\0' &&
				memcmp(entry->name, VARDATA_ANY(arg), len) == 0)
			{
				Touch(cache, entry);
				fcinfo->flinfo->fn_extra = &SeenOnce;
				return entry;
			}
		}
	}
	return CallSiteLookup(fcinfo, cache, is_new);
}

/*
 * The cache entry for the name in argument 0.  NULL, empty and over-long
 * names are rejected here.
 */
CacheEntry *
CallSiteEntry(FunctionCallInfo fcinfo, ObjectCache *cache, bool *is_new)
{
	CallSite   *cs = (CallSite *) fcinfo->flinfo->fn_extra;

	*is_new = false;
	/* a literal name: the entry this call site found before, if still there */
	if (cs && cs->constant && cs->cache == cache && cs->entry->incarnation == cs->incarnation)
	{
		Touch(cache, cs->entry);
		return cs->entry;
	}
	if (cs == NULL)
		return CallSiteFirst(fcinfo, cache, is_new);
	return CallSiteLookup(fcinfo, cache, is_new);
}

/* Remove an entry for a name that turned out not to exist. */
void
ForgetEntry(ObjectCache *cache, CacheEntry *entry)
{
	EvictEntry(cache, entry);
}
