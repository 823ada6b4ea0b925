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
 * executor which indexes need entries for the new version: TU_All after a
 * non-HOT update, TU_Summarizing after a HOT update when summarizing (BRIN)
 * indexes still need one, TU_None otherwise.  Before 16 every HOT update
 * needs none.  *indexes gets the same answer on every major.
 */
typedef enum ShardedIndexUpdate
{
	INDEX_UPDATE_NONE,
	INDEX_UPDATE_ALL,
	INDEX_UPDATE_SUMMARIZING
} ShardedIndexUpdate;

static inline TM_Result
ShardedHeapUpdate(Relation rel, ItemPointer otid, HeapTuple newtup,
				  CommandId cid, Snapshot crosscheck, bool wait,
				  TM_FailureData *tmfd, LockTupleMode *lockmode,
				  ShardedIndexUpdate *indexes)
{
	TM_Result	result;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes = TU_All;

	result = heap_update(rel, otid, newtup, cid, crosscheck, wait, tmfd,
						 lockmode, &update_indexes);
	*indexes = update_indexes == TU_All ? INDEX_UPDATE_ALL :
		update_indexes == TU_Summarizing ? INDEX_UPDATE_SUMMARIZING : INDEX_UPDATE_NONE;
#else
	result = heap_update(rel, otid, newtup, cid, crosscheck, wait, tmfd,
						 lockmode);
	*indexes = HeapTupleIsHeapOnly(newtup) ? INDEX_UPDATE_NONE : INDEX_UPDATE_ALL;
#endif
	return result;
}

/* The shared transaction counters were renamed in 17. */
#include "access/transam.h"
#if PG_VERSION_NUM >= 170000
#define ShardedTransamVariables TransamVariables
#else
#define ShardedTransamVariables ShmemVariableCache
#endif

/* A backend's local transaction id moved into its virtual xid in 17. */
#include "storage/proc.h"
#if PG_VERSION_NUM >= 170000
#define MyLocalTransactionId() (MyProc->vxid.lxid)
#else
#define MyLocalTransactionId() (MyProc->lxid)
#endif

/* Ownership checks were renamed in 16. */
#include "catalog/pg_class.h"
#include "catalog/pg_database.h"
#include "utils/acl.h"

static inline bool
DatabaseOwnedBy(Oid dbid, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return object_ownercheck(DatabaseRelationId, dbid, role);
#else
	return pg_database_ownercheck(dbid, role);
#endif
}

/*
 * Connecting to another server from a backend, as logical replication's
 * table synchronization does (libpqwalreceiver, loaded first).
 * walrcv_connect gained must_use_password in 16 (a subscription owned by a
 * non-superuser must authenticate with a password) and replication in 17
 * (false: a plain connection); a logical replication connection runs SQL on
 * every major.
 */
#include "catalog/pg_subscription.h"
#include "miscadmin.h"
#include "replication/walreceiver.h"

static inline WalReceiverConn *
ShardedConnectAsSubscription(Subscription *sub, const char *appname, char **err)
{
#if PG_VERSION_NUM >= 160000
	bool		must_use_password = sub->passwordrequired && !superuser_arg(sub->owner);
#endif

#if PG_VERSION_NUM >= 170000
	return walrcv_connect(sub->conninfo, true, true, must_use_password, appname, err);
#elif PG_VERSION_NUM >= 160000
	return walrcv_connect(sub->conninfo, true, must_use_password, appname, err);
#else
	return walrcv_connect(sub->conninfo, true, appname, err);
#endif
}

static inline bool
RelationOwnedBy(Oid relid, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return object_ownercheck(RelationRelationId, relid, role);
#else
	return pg_class_ownercheck(relid, role);
#endif
}

#endif							/* SHARDED_SEQ_COMPAT_H */
