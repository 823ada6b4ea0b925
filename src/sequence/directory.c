/*
 * directory.c
 *	  The sequence directory: a copy, in shared memory, of the configuration
 *	  of node-cached sequences, so that a new session's first
 *	  sharded_nextval reads no table (when sharded_seq is preloaded).
 *
 * A new backend has no relation cache: reading sequence_config and
 * sequence_shards through their indexes builds four relcache entries, most
 * of what a short connection's sharded_nextval costs over SELECT 1.  The
 * directory holds, per database and name, what the draw from the node cache
 * needs (engine.c).  A copy is made by a session that read the tables with
 * a snapshot taken after it saw the config word settled
 * (common/config_word.c), and only while the trigger that marks every row
 * written by hand or by replication is in place and no cutover stopped this
 * server; it is trusted while the word has not moved.  A trusted copy is
 * never the last word on a block: every reservation reads the tables again
 * under the sequence's draw lock (engine.c CarveBlock, node_reserve.c), as
 * before.
 *
 * Lock: the directory's LWLock, shared to read, exclusive to make a copy;
 * nothing else is taken under it (the config word is read before it).
 */
#include "postgres.h"

#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"

#include "sequence/sequence_internal.h"

typedef struct DirKey
{
	Oid			dbid;
	char		name[NAMEDATALEN];
} DirKey;

typedef struct DirEntry
{
	DirKey		key;
	uint64		word;			/* the config word the copy was made under */
	SequenceCopy copy;
} DirEntry;

typedef struct DirShared
{
	LWLock	   *lock;
	int			entries;		/* in the hash: at most NodeCacheSequences */
} DirShared;

static DirShared *Dir = NULL;
static HTAB *DirHash = NULL;

Size
SequenceDirectoryShmemSize(void)
{
	if (NodeCacheSequences <= 0)
		return 0;
	return add_size(MAXALIGN(sizeof(DirShared)),
					hash_estimate_size(NodeCacheSequences, sizeof(DirEntry)));
}

void
SequenceDirectoryShmemInit(void)
{
	HASHCTL		ctl;
	bool		found;

	if (NodeCacheSequences <= 0)
		return;
	Dir = ShmemInitStruct("sharded_seq sequence directory", sizeof(DirShared), &found);
	if (!found)
	{
		Dir->lock = &(GetNamedLWLockTranche("sharded_seq directory"))->lock;
		Dir->entries = 0;
	}
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(DirKey);
	ctl.entrysize = sizeof(DirEntry);
	DirHash = ShmemInitHash("sharded_seq sequence directory hash", NodeCacheSequences,
							NodeCacheSequences, &ctl, HASH_ELEM | HASH_BLOBS);
}

static DirKey
MakeDirKey(const char *name)
{
	DirKey		key;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	strlcpy(key.name, name, sizeof(key.name));
	return key;
}

/* Copy out name's configuration if the directory holds a current copy. */
bool
DirectoryFind(const char *name, SequenceCopy *out)
{
	DirKey		key;
	DirEntry   *e;
	uint64		word;
	bool		found = false;

	if (Dir == NULL || !ConfigWordSettled(&word))
		return false;
	key = MakeDirKey(name);
	LWLockAcquire(Dir->lock, LW_SHARED);
	e = hash_search(DirHash, &key, HASH_FIND, NULL);
	if (e != NULL && e->word == word)
	{
		*out = e->copy;
		found = true;
	}
	LWLockRelease(Dir->lock);
	return found;
}

/* Drop every copy made under another word than word.  Exclusive lock held. */
static void
SweepStale(uint64 word)
{
	HASH_SEQ_STATUS status;
	DirEntry   *e;

	hash_seq_init(&status, DirHash);
	while ((e = hash_seq_search(&status)) != NULL)
	{
		if (e->word == word)
			continue;
		hash_search(DirHash, &e->key, HASH_REMOVE, NULL);
		Dir->entries--;
	}
}

/*
 * Keep copy as name's configuration, read from the tables with a snapshot
 * taken after the config word was seen settled at word.  Nothing is kept if
 * the word moved since, or the directory is full of current copies.
 */
void
DirectoryPublish(const char *name, const SequenceCopy *copy, uint64 word)
{
	DirKey		key;
	DirEntry   *e;
	uint64		now;
	bool		found;

	/* a copy is taken only under the word it was made under: this only spares a stale one */
	if (Dir == NULL || !ConfigWordSettled(&now) || now != word)
		return;
	key = MakeDirKey(name);
	LWLockAcquire(Dir->lock, LW_EXCLUSIVE);
	e = hash_search(DirHash, &key, HASH_FIND, NULL);
	if (e == NULL && Dir->entries >= NodeCacheSequences)
		SweepStale(word);
	if (e == NULL && Dir->entries < NodeCacheSequences)
	{
		e = hash_search(DirHash, &key, HASH_ENTER_NULL, &found);
		if (e != NULL && !found)
			Dir->entries++;
	}
	if (e != NULL)
	{
		e->word = word;
		e->copy = *copy;
	}
	LWLockRelease(Dir->lock);
}
