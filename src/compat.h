/*
 * compat.h
 *	  Differences between the PostgreSQL majors sharded_seq supports (15, 16,
 *	  17 and 18), guarded with PG_VERSION_NUM.  Each shim is named after what
 *	  it stands for, and the call sites use the shim on every major.
 */
#ifndef SHARDED_SEQ_COMPAT_H
#define SHARDED_SEQ_COMPAT_H

#include "postgres.h"

#include "access/heapam.h"
/*
 * pg_add_s64_overflow() and friends.  Before 16 some headers pulled this in
 * indirectly; from 16 on they do not.
 */
#include "common/int.h"

#if PG_VERSION_NUM < 150000
#error "sharded_seq needs PostgreSQL 15 or later"
#endif

/*
 * heap_update() gained a TU_UpdateIndexes * argument in 16, telling the
 * executor which indexes need entries for the new version: TU_None or
 * TU_Summarizing after a HOT update, TU_All otherwise.
 *
 * Callers here decide on index maintenance from HeapTupleIsHeapOnly(newtup),
 * as on 15: heap_update() marks the new version heap-only exactly when the
 * update was HOT, on every major.  So this wrapper gives the same answer on
 * every major, and checks (in assert-enabled builds) that 16's answer agrees.
 * A summarizing (BRIN) index would need TU_Summarizing entries even after a
 * HOT update; the tables updated through this wrapper have none.
 */
static inline TM_Result
ShardedHeapUpdate(Relation rel, ItemPointer otid, HeapTuple newtup,
				  CommandId cid, Snapshot crosscheck, bool wait,
				  TM_FailureData *tmfd, LockTupleMode *lockmode)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes = TU_All;
	TM_Result	result;

	result = heap_update(rel, otid, newtup, cid, crosscheck, wait, tmfd,
						 lockmode, &update_indexes);
	Assert(result != TM_Ok ||
		   (update_indexes == TU_All) == !HeapTupleIsHeapOnly(newtup));
	Assert(result != TM_Ok || update_indexes != TU_Summarizing);
	return result;
#else
	return heap_update(rel, otid, newtup, cid, crosscheck, wait, tmfd,
					   lockmode);
#endif
}

#endif							/* SHARDED_SEQ_COMPAT_H */
