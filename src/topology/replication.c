/*
 * replication.c
 *	  Synchronous standbys: a sequence block or memcached lease is used only
 *	  once the standbys that a commit would wait for have confirmed its WAL.
 *
 * XLogFlush makes a reservation durable on this server only.  A standby that
 * never received it can be promoted and carve the same block again, so when
 * synchronous replication is in force the reservation's LSN is waited for as
 * a commit record is, once per block.  SyncRepWaitForLSN turns a cancel or a
 * termination into a WARNING and returns, so afterwards the standbys'
 * confirmed position is checked, and an unconfirmed block raises an error
 * before anything could use it.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
#include "common/hashfn.h"
#include "utils/guc.h"

#include "topology/topology.h"

/*
 * The level a wait for a non-commit record uses: SyncRepWaitForLSN caps it
 * at remote flush, because only commit records report their replay.
 */
static int
SyncWaitMode(void)
{
	switch (synchronous_commit)
	{
		case SYNCHRONOUS_COMMIT_REMOTE_WRITE:
			return SYNC_REP_WAIT_WRITE;
		case SYNCHRONOUS_COMMIT_REMOTE_FLUSH:
		case SYNCHRONOUS_COMMIT_REMOTE_APPLY:
			return SYNC_REP_WAIT_FLUSH;
		default:
			return SYNC_REP_NO_WAIT;
	}
}

/*
 * The checkpointer's record of synchronous_standby_names in WalSndCtl is one
 * byte that minor releases changed: a bool sync_standbys_defined before,
 * flags sync_standbys_status (initialized, defined) from 15.13, 16.9 and 17.5
 * on.  A module built against one may run on the other, so the byte is read
 * as the running server lays it out.
 */
#define STATUS_INIT		(1 << 0)	/* SYNC_STANDBY_INIT */
#define STATUS_DEFINED	(1 << 1)	/* SYNC_STANDBY_DEFINED */

#ifdef SYNC_STANDBY_DEFINED
#define SYNC_STANDBYS_BYTE(ctl) ((ctl)->sync_standbys_status)
#else
#define SYNC_STANDBYS_BYTE(ctl) ((ctl)->sync_standbys_defined)
#endif

static pg_noinline int8
ReadServerHasStatusFlags(void)
{
	int			version = atoi(GetConfigOption("server_version_num", false, false));

	return version >= 170005 ||
		(version >= 160009 && version < 170000) ||
		(version >= 150013 && version < 160000);
}

static inline bool
ServerHasStatusFlags(void)
{
	static int8 has = -1;		/* not read yet */

	if (has < 0)
		has = ReadServerHasStatusFlags();
	return has != 0;
}

/*
 * Would SyncRepWaitForLSN wait for standbys now?  The same test it makes:
 * the checkpointer's record, or this backend's setting until the
 * checkpointer has read it.
 */
static inline bool
SyncStandbysInForce(void)
{
	uint8		status = *(volatile uint8 *) &SYNC_STANDBYS_BYTE(WalSndCtl);

	if (!ServerHasStatusFlags())
		return status != 0;
	if (status & STATUS_INIT)
		return (status & STATUS_DEFINED) != 0;
	return SyncRepStandbyNames != NULL && SyncRepStandbyNames[0] != '\0';
}

/*
 * Did the wait for lsn end the way a commit's wait may end: confirmed at this
 * level, or released because synchronous standbys are no longer in force?
 * Both are read under the lock the checkpointer holds while it releases the
 * waiters and then clears the flag, so that release is never mistaken for a
 * cancel.
 */
static bool
WaitFulfilled(XLogRecPtr lsn, int mode)
{
	bool		fulfilled;

	LWLockAcquire(SyncRepLock, LW_SHARED);
	fulfilled = !SyncStandbysInForce() || lsn <= WalSndCtl->lsn[mode];
	LWLockRelease(SyncRepLock);
	return fulfilled;
}

/*
 * Wait until the synchronous standbys confirm lsn, the end of the WAL that
 * reserves a block of sequence seqname, if this transaction's commit would
 * wait for them.  Raises an error if the wait ends unconfirmed; the caller
 * must not have installed the block yet.
 */
void
WaitForSyncStandbys(XLogRecPtr lsn, const char *seqname)
{
	int			mode = SyncWaitMode();

	if (!SyncRepRequested() || mode == SYNC_REP_NO_WAIT || WalSndCtl == NULL ||
		!SyncStandbysInForce())
		return;

	/* as at commit: the wait's queue cleanup must not be interrupted */
	HOLD_INTERRUPTS();
	SyncRepWaitForLSN(lsn, false);
	RESUME_INTERRUPTS();

	/* otherwise a cancel, a termination or the postmaster's death: it warned */
	if (WaitFulfilled(lsn, mode))
		return;

	/* a termination ends the session here (FATAL) */
	CHECK_FOR_INTERRUPTS();
	ereport(ERROR,
			(errcode(ERRCODE_QUERY_CANCELED),
			 errmsg("wait for the synchronous standbys to confirm a block of sharded sequence \"%s\" was canceled",
					seqname),
			 errdetail("The block reserved at %X/%X is discarded unused; the warning about a local commit does not apply to it.",
					   LSN_FORMAT_ARGS(lsn)),
			 errhint("Retry once the synchronous standbys are connected and streaming, or stop waiting for them in this session with SET synchronous_commit = local.")));
}

/*
 * Are synchronous standbys in force (a commit with synchronous_commit = on
 * would wait for them)?  The worker reserves no node cache block then: it
 * must not wait for a standby at shutdown.
 */
bool
SyncStandbysActive(void)
{
	return max_wal_senders > 0 && WalSndCtl != NULL && SyncStandbysInForce();
}

/*
 * May this session reserve a block that every session of the node uses (the
 * node cache)?  Only if its wait confirms the block as a commit with
 * synchronous_commit = on would be confirmed: at remote flush, when
 * synchronous standbys are in force.  Otherwise it draws per session.
 */
bool
ReservationConfirmedHere(void)
{
	return !SyncStandbysActive() ||
		(SyncRepRequested() && SyncWaitMode() == SYNC_REP_WAIT_FLUSH);
}

/*
 * The synchronous replication state a node cache block is confirmed under:
 * 0 when no synchronous standby is in force, else a hash of
 * synchronous_standby_names as this backend sees it (never 0).  A block is
 * handed out only under the state it was confirmed under: one confirmed
 * before the standbys came into force, or by another standby set, would be
 * missing on a standby promoted later.
 */
static pg_noinline uint32
SyncStampOfNames(void)
{
	static char *names = NULL;
	static uint32 hash = 0;

	if (SyncRepStandbyNames == NULL)
		return 1;
	if (names == NULL || strcmp(names, SyncRepStandbyNames) != 0)
	{
		if (names)
			free(names);
		names = strdup(SyncRepStandbyNames);
		if (names == NULL)
			return 1;
		hash = hash_bytes((const unsigned char *) names, (int) strlen(names)) | 1;
	}
	return hash;
}

/*
 * SyncStamp's common answer (common.h): the checkpointer's byte, once known,
 * holding the value that means "no synchronous standby in force".
 */
const volatile uint8 *SyncStatusByte = NULL;
uint8		SyncNoneStatus = 0;

uint32
SyncStampSlow(void)
{
	static const uint8 none = 0;

	if (!IsUnderPostmaster || max_wal_senders == 0)
	{
		/* a single-user server, or one with no WAL sender, has no standby */
		SyncNoneStatus = none;
		SyncStatusByte = &none;
		return 0;
	}
	if (WalSndCtl == NULL)
		return 0;
	if (SyncStatusByte == NULL)
	{
		SyncNoneStatus = ServerHasStatusFlags() ? STATUS_INIT : 0;
		SyncStatusByte = (const volatile uint8 *) &SYNC_STANDBYS_BYTE(WalSndCtl);
	}
	if (!SyncStandbysInForce())
		return 0;
	return SyncStampOfNames();
}
