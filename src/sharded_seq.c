/*
 * sharded_seq.c
 *	  Module initialisation and settings.  All settings live under the
 *	  reserved "sharded_seq." prefix.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "sharded_seq.h"

PG_MODULE_MAGIC;

int			DefaultSequenceShards = 4;
int			DefaultBlock = 1000;
int			DefaultCounterShards = 16;

void		_PG_init(void);

/*
 * Range checks live in check hooks rather than in the GUC bounds, so that a
 * bad value gets a hint that names the fix.
 */
static bool
CheckRange(int value, int max, const char *what)
{
	if (value >= 1 && value <= max)
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("%s must be between 1 and %d.", what, max);
	GUC_check_errhint("Choose a value in that range, or RESET the setting to its default.");
	return false;
}

static bool
CheckShards(int *newval, void **extra, GucSource source)
{
	return CheckRange(*newval, SHARDED_SEQ_MAX_SHARDS, "The shard count");
}

static bool
CheckBlock(int *newval, void **extra, GucSource source)
{
	return CheckRange(*newval, SHARDED_SEQ_MAX_BLOCK, "The block size");
}

void
_PG_init(void)
{
	DefineCustomIntVariable("sharded_seq.default_sequence_shards",
							"Shards given to a sharded sequence when create_sequence() is not told.",
							"More shards let more sessions reserve blocks at once.",
							&DefaultSequenceShards, 4, INT_MIN, INT_MAX,
							PGC_USERSET, 0, CheckShards, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_block",
							"Values a session reserves at once from a sharded sequence when create_sequence() is not told.",
							"Larger blocks cost fewer durable reservations; a session that ends leaves the rest of its block unused.",
							&DefaultBlock, 1000, INT_MIN, INT_MAX,
							PGC_USERSET, 0, CheckBlock, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_counter_shards",
							"Shards given to a counter that create_counter() or counter_incr() creates without being told.",
							"About as many shards as concurrent writers keeps increments from waiting.",
							&DefaultCounterShards, 16, INT_MIN, INT_MAX,
							PGC_USERSET, 0, CheckShards, NULL, NULL);
	MarkGUCPrefixReserved("sharded_seq");
	CatalogInit();
	CounterInit();
}
