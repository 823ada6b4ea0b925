/*
 * wait_point.c
 *	  Wait points: places where a test can hold a backend, built only into
 *	  test builds (make WAIT_POINTS=1).  A normal build compiles WAIT_POINT()
 *	  to nothing and this file to no code at all.
 *
 *	  A backend that reaches WAIT_POINT("name") takes, and at once gives back,
 *	  a share lock on two advisory locks: the point's, (WAIT_POINT_CLASS,
 *	  hashtext('name')), then its own at the point, (WAIT_BACKEND_CLASS,
 *	  hashtext('name') # pg_backend_pid()).  A test session that holds the
 *	  first exclusively, with pg_advisory_lock(1397970768, hashtext('name')),
 *	  holds every backend that reaches the point; one that holds the second,
 *	  with pg_advisory_lock(1397965378, hashtext('name') # PID), holds only
 *	  backend PID there.  The wait is an ordinary lock wait: the isolation
 *	  tester shows the step as waiting, pg_locks shows it, and the test lets
 *	  the backend go on by unlocking.  The same idea as TimescaleDB's debug
 *	  points; injection points need a server built for them.
 */
#include "postgres.h"

#ifdef SHARDED_SEQ_WAIT_POINTS

#include "common/common.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"

void
WaitPointReached(const char *name)
{
	/* the key hashtext() gives the name in SQL, for the test to lock */
	uint32		key = hash_bytes((const unsigned char *) name, strlen(name));
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) WAIT_POINT_CLASS, key, 2);
	(void) LockAcquire(&tag, ShareLock, false, false);
	LockRelease(&tag, ShareLock, false);

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) WAIT_BACKEND_CLASS,
						 key ^ (uint32) MyProcPid, 2);
	(void) LockAcquire(&tag, ShareLock, false, false);
	LockRelease(&tag, ShareLock, false);
}

#endif
