EXTENSION = sharded_seq
MODULE_big = sharded_seq
OBJS = src/module.o src/common/registry.o \
	src/common/catalog.o src/common/privileges.o src/common/cache.o src/common/memcache.o src/common/node.o \
	src/common/replication.o src/common/stats.o \
	src/sequence/engine.o src/sequence/admin.o \
	src/counter/engine.o src/counter/rows.o src/counter/layout.o src/counter/kept.o \
	src/counter/slots.o src/counter/buffered.o src/counter/memcached.o \
	src/counter/maintain.o src/counter/admin.o \
	src/worker/launcher.o src/worker/worker.o src/worker/hooks.o \
	src/worker/status.o src/worker/maintain.o
DATA = $(wildcard sharded_seq--*.sql)
PG_CPPFLAGS = -I$(srcdir)/src
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
$(OBJS): $(wildcard src/*/*.h)
