/*
 * kept.c
 *	  Counter totals kept in shared memory for every session of the server.
 *
 * A session that keeps a counter's total (KeepRows, sums.c)
 * publishes it here, and a session that meets the counter for the first time
 * reads it here instead of scanning the rows.  What says how long a kept
 * total holds belongs to no session: the counter's layout word, the xmax of
 * the snapshot the rows were seen with, and the version of its config row.
 * The reader checks them against its own snapshot, as for its own totals.
 *
 * A fixed table of 4-way buckets (sharded_seq.shared_totals entries); a new
 * total replaces another counter's in a full bucket.  Each entry is a
 * seqlock: a writer that finds it taken skips it, a reader that finds it
 * changed while copying treats it as absent.  Nothing waits.
 */
#include "postgres.h"

#include "common/hashfn.h"
#include "common/pg_prng.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/shmem.h"

#include "counter/counter_internal.h"

#define KEPT_WAYS	4

typedef struct KeptEntry
{
	pg_atomic_uint32 seq;		/* odd while being written */
	Oid			dbid;			/* InvalidOid: empty */
	Oid			install;		/* counter_config's OID */
	int32		counter_id;
	KeptTotal	total;
} KeptEntry;

typedef struct KeptShared
{
	uint32		nbuckets;
	KeptEntry	entries[FLEXIBLE_ARRAY_MEMBER];
} KeptShared;

int			SharedTotals = 65536;
static KeptShared *Kept = NULL;

static uint32
KeptBuckets(void)
{
	return (uint32) (SharedTotals / KEPT_WAYS);
}

Size
KeptShmemSize(void)
{
	return add_size(offsetof(KeptShared, entries),
					mul_size(KeptBuckets() * KEPT_WAYS, sizeof(KeptEntry)));
}

void
KeptShmemInit(void)
{
	bool		found;

	if (KeptBuckets() == 0)
		return;
	Kept = ShmemInitStruct("sharded_seq kept totals", KeptShmemSize(), &found);
	if (!found)
	{
		Kept->nbuckets = KeptBuckets();
		for (uint32 i = 0; i < Kept->nbuckets * KEPT_WAYS; i++)
		{
			pg_atomic_init_u32(&Kept->entries[i].seq, 0);
			Kept->entries[i].dbid = InvalidOid;
		}
	}
}

static KeptEntry *
KeptBucket(Oid install, int32 counter_id)
{
	uint32		h = hash_combine(murmurhash32((uint32) MyDatabaseId),
								 hash_combine(murmurhash32((uint32) install),
											  murmurhash32((uint32) counter_id)));

	return &Kept->entries[(h % Kept->nbuckets) * KEPT_WAYS];
}

/* Is a copied entry this counter's, of this database and installation? */
static bool
EntryIs(const KeptEntry *copy, Oid install, int32 counter_id)
{
	return copy->dbid == MyDatabaseId && copy->install == install &&
		copy->counter_id == counter_id;
}

/*
 * Copy an entry, if nobody wrote it meanwhile.  The keys are copied under
 * the seqlock too: a reused entry must not pass for another counter's.
 */
static bool
ReadEntry(KeptEntry *e, KeptEntry *copy)
{
	uint32		seq = pg_atomic_read_u32(&e->seq);

	if (seq & 1)
		return false;
	pg_read_barrier();
	copy->dbid = e->dbid;
	copy->install = e->install;
	copy->counter_id = e->counter_id;
	copy->total = e->total;
	pg_read_barrier();
	return pg_atomic_read_u32(&e->seq) == seq;
}

/* The total some session kept for this counter of this database, if any. */
bool
SharedKeptTotal(int32 counter_id, KeptTotal *total)
{
	Oid			install;
	KeptEntry  *bucket;

	if (Kept == NULL)
		return false;
	install = ConfigRelid("counter_config");
	bucket = KeptBucket(install, counter_id);
	for (int i = 0; i < KEPT_WAYS; i++)
	{
		KeptEntry	copy;

		if (ReadEntry(&bucket[i], &copy) && EntryIs(&copy, install, counter_id))
		{
			*total = copy.total;
			return true;
		}
	}
	return false;
}

/*
 * Publish a total this session kept: in the counter's entry, else an empty
 * one, else any.  A total published late (its word has moved on) only fails
 * the readers' check.
 */
void
ShareKeptTotal(int32 counter_id, const KeptTotal *total)
{
	Oid			install;
	KeptEntry  *bucket;
	KeptEntry  *victim = NULL;
	uint32		seq;

	if (Kept == NULL)
		return;
	install = ConfigRelid("counter_config");
	bucket = KeptBucket(install, counter_id);
	for (int i = 0; i < KEPT_WAYS && victim == NULL; i++)
	{
		KeptEntry	copy;

		if (!ReadEntry(&bucket[i], &copy))
			continue;
		if (EntryIs(&copy, install, counter_id) || copy.dbid == InvalidOid)
			victim = &bucket[i];
	}
	if (victim == NULL)
		victim = &bucket[pg_prng_uint32(&pg_global_prng_state) % KEPT_WAYS];
	seq = pg_atomic_read_u32(&victim->seq);
	/* a full barrier: the entry is written only after it is taken */
	if ((seq & 1) || !pg_atomic_compare_exchange_u32(&victim->seq, &seq, seq + 1))
		return;
	victim->dbid = MyDatabaseId;
	victim->install = install;
	victim->counter_id = counter_id;
	victim->total = *total;
	pg_write_barrier();
	pg_atomic_write_u32(&victim->seq, seq + 2);
}

/*
 * A database was created: totals of an earlier database with its OID (CREATE
 * DATABASE ... OID, made from the same template) would pass every check.
 * Nobody can connect to it before this transaction commits.
 */
void
ForgetSharedTotals(Oid dbid)
{
	if (Kept == NULL || !OidIsValid(dbid))
		return;
	for (uint32 i = 0; i < Kept->nbuckets * KEPT_WAYS; i++)
	{
		KeptEntry  *e = &Kept->entries[i];
		uint32		seq = pg_atomic_read_u32(&e->seq);

		if (e->dbid != dbid)
			continue;
		/* a writer of this entry would be a session of a dropped database */
		while ((seq & 1) || !pg_atomic_compare_exchange_u32(&e->seq, &seq, seq + 1))
		{
			pg_spin_delay();
			seq = pg_atomic_read_u32(&e->seq);
		}
		if (e->dbid == dbid)
			e->dbid = InvalidOid;
		pg_write_barrier();
		pg_atomic_write_u32(&e->seq, seq + 2);
	}
}
