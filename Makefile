EXTENSION = sharded_seq
MODULE_big = sharded_seq
OBJS = src/sharded_seq.o src/catalog.o src/sequence.o src/sequence_admin.o src/replication.o src/node.o src/counter.o src/counter_admin.o src/counter_maintain.o src/counter_memcached.o src/counter_buffer.o src/counter_kept.o src/worker.o src/counter_shards.o src/memcache.o src/stats.o
DATA = $(wildcard sharded_seq--*.sql)
PGFILEDESC = "sharded_seq - sharded sequences and counters"

REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=sharded_seq
SHLIB_LINK = -lmemcached

# Tests build with warnings as errors: make WERROR=1
ifdef WERROR
PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# every object depends on the shared headers (PGXS tracks no header changes)
$(OBJS): src/sharded_seq.h src/compat.h
