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

void
_PG_init(void)
{
	DefineCustomIntVariable("sharded_seq.default_sequence_shards",
							"Shards given to a sharded sequence when create_sequence() is not told.",
							"More shards let more sessions reserve blocks at once.",
							&DefaultSequenceShards, 4, 1, SHARDED_SEQ_MAX_SHARDS,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_block",
							"Values a session reserves at once from a sharded sequence when create_sequence() is not told.",
							"Larger blocks cost fewer durable reservations; a session that ends leaves the rest of its block unused.",
							&DefaultBlock, 1000, 1, SHARDED_SEQ_MAX_BLOCK,
							PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("sharded_seq.default_counter_shards",
							"Shards given to a counter that create_counter() or counter_incr() creates without being told.",
							"About as many shards as concurrent writers keeps increments from waiting.",
							&DefaultCounterShards, 16, 1, SHARDED_SEQ_MAX_SHARDS,
							PGC_USERSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("sharded_seq");
	CatalogInit();
}
