/*
 * counter.h
 *	  The door of src/counter/: sharded counters.  What the layers above (the
 *	  worker, module.c) may use; the internals stay in counter_internal.h.
 */
#ifndef SHARDED_SEQ_COUNTER_H
#define SHARDED_SEQ_COUNTER_H

#include "common/common.h"

/* settings (module.c registers them) */
extern int	DefaultCounterShards;
extern int	MaxCounterShards;
extern int	CounterFlushInterval;
extern int	CounterFoldAfter;
extern int	BufferedSlots;
extern int	SharedTotals;
extern int	MemcachedBatchDelay;

/* engine.c */
extern void CounterInit(void);

/* shared memory (slots.c, layout.c, kept.c) */
extern Size SlotsShmemSize(void);
extern void SlotsShmemInit(void);
extern Size LayoutShmemSize(void);
extern void LayoutShmemInit(void);
extern Size KeptShmemSize(void);
extern void KeptShmemInit(void);

/* config.c: a counter's configuration row, as the engine and the worker need it */
typedef struct CounterConfigRow
{
	int32		id;
	int32		shards;			/* pinned layout, or 0: adaptive */
	CounterMode mode;
	Oid			owner;
	Acl		   *acl;			/* palloc'd, or NULL */
	TransactionId xmin;
} CounterConfigRow;

extern bool FetchCounterConfig(const char *name, int32 id, CounterConfigRow *row);

/* maintain.c: maintain()'s counter part */
extern void CounterMaintain(int32 base, int *folded, int *gathered);

/* slots.c: the slot table, as the worker runs it */
extern int	SlotCounters(Oid install, int32 **ids);
extern void SlotsFreeIdle(Oid install);
extern void SlotsFreeGoneDatabases(const Oid *existing, int n);
extern int	SlotsPinnedHere(int32 *ids, int max);
extern bool SlotsLeftHere(void);
extern void SlotsReportLeft(void);
extern int	SlotsForwardCandidates(Oid install, int32 **ids);
extern void SlotForwardStop(Oid install, int32 counter_id);

/* buffered.c: mode 'buffered', the flush */
extern int64 BufferedFlush(int32 counter_id, const char *name, bool wait);

/* memcached.c: mode 'memcached', the flush and the forwarding */
extern int64 MemcachedFlush(int32 counter_id, int32 shard, const char *name, bool wait);
extern int64 MemcachedForward(Oid install, int32 counter_id);

/*
 * Sub-id of the counter object lock that the worker's forwarding and
 * flush_counters take (0, the counter's own, is alter_counter's and the
 * commits'): flush_counters then never waits for an alter_counter.
 */
#define FORWARD_LOCK_SUBID	1

/* layout.c: commands that change the shard table mark every word */
extern bool LayoutWordsAvailable(void);
extern void LayoutChangingAll(void);

/* kept.c: a new database copies no kept totals */
extern void ForgetSharedTotals(Oid dbid);

#endif							/* SHARDED_SEQ_COUNTER_H */
