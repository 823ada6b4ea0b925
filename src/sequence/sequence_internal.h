/*
 * sequence_internal.h
 *	  Shared by the files of src/sequence/ only.
 */
#ifndef SHARDED_SEQ_SEQUENCE_INTERNAL_H
#define SHARDED_SEQ_SEQUENCE_INTERNAL_H

#include "sequence/sequence.h"

/* admin.c: where blocks of a generation start */
extern int64 GenerationHighWater(int32 seq_id, int32 generation, int64 base,
								 int32 shards, int32 block);
extern int64 BlockStart(int64 base, int64 k, int32 shards, int32 shard,
						int32 block, bool *overflow);

#endif							/* SHARDED_SEQ_SEQUENCE_INTERNAL_H */
