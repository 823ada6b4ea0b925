EXTENSION = sharded_seq
MODULE_big = sharded_seq
OBJS = src/module.o src/common/registry.o \
	src/common/catalog.o src/common/privileges.o src/common/cache.o src/common/memcache.o \
	src/common/stats.o src/common/wait_point.o src/common/config_word.o \
	src/topology/topology.o src/topology/node.o src/topology/citus.o src/topology/peers.o \
	src/topology/cutover.o src/topology/replication.o \
	src/sequence/engine.o src/sequence/node_cache.o src/sequence/node_sweep.o src/sequence/node_reserve.o src/sequence/node_draw.o src/sequence/admin.o src/sequence/cutover.o src/sequence/adopt.o src/sequence/usage.o src/sequence/shards.o src/sequence/directory.o \
	src/counter/engine.o src/counter/rows.o src/counter/config.o src/counter/sums.o src/counter/apply.o \
	src/counter/rewrite.o src/counter/layout.o src/counter/kept.o \
	src/counter/slots.o src/counter/buffered.o src/counter/memcached.o \
	src/counter/maintain.o src/counter/admin.o \
	src/worker/launcher.o src/worker/worker.o src/worker/hooks.o \
	src/worker/status.o src/worker/maintain.o
DATA = $(wildcard sharded_seq--*.sql)
PG_CPPFLAGS = -I$(srcdir)/src
PGFILEDESC = "sharded_seq - sharded sequences and counters"

REGRESS = $(patsubst sql/%.sql,%,$(sort $(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=sharded_seq
# Isolation specs (specs/NAME.spec, expected/NAME.out) and TAP tests (t/*.pl,
# with PostgreSQL::Test::Cluster and t/ShardedSeq/*.pm) hold backends at wait
# points: they need a test build, and run with it only
# (make WAIT_POINTS=1 install installcheck; test/README.md).  A normal
# build's installcheck, such as the Debian package's, runs sql/ alone.
# WAIT_POINTS empty or 0 is a normal build.
WAIT_POINTS_BUILD := $(if $(filter-out 0,$(WAIT_POINTS)),on,off)
ifeq ($(WAIT_POINTS_BUILD),on)
ISOLATION = $(patsubst specs/%.spec,%,$(sort $(wildcard specs/*.spec)))
ISOLATION_OPTS = --load-extension=sharded_seq
TAP_TESTS = 1
endif
# libpq: topology/peers.c's connections to the other nodes of a Citus cluster
SHLIB_LINK = -lpq
# Calls from one file of the module to another bind inside it, not through
# the PLT: a draw crosses several files (PostgreSQL 16 on hides the symbols
# of modules, which does the same).
PG_CFLAGS += -fno-semantic-interposition
SHLIB_LINK += -Wl,-Bsymbolic
PG_CPPFLAGS += -I$(shell $(PG_CONFIG) --includedir)

# Test builds hold wait points (src/common/wait_point.c): make WAIT_POINTS=1.
# .wait_points records which kind the objects are; it changes, and so every
# object is rebuilt, when a make asks for the other kind (PGXS would keep
# objects built with other flags).
ifeq ($(WAIT_POINTS_BUILD),on)
PG_CPPFLAGS += -DSHARDED_SEQ_WAIT_POINTS
endif
ifneq ($(WAIT_POINTS_BUILD),$(shell cat .wait_points 2>/dev/null))
$(shell echo $(WAIT_POINTS_BUILD) > .wait_points)
endif
EXTRA_CLEAN = .wait_points

# Tests build with warnings as errors: make WERROR=1
ifdef WERROR
PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers
endif

PG_CONFIG ?= pg_config

# libmemcached, for the memcached tier and mode (src/common/memcache.c, the
# only file that uses it): built with it when its header is found (MEMCACHED
# unset or empty); make MEMCACHED=1 insists on it (and stops without it),
# make MEMCACHED=0 builds without it.  .memcached records which kind
# memcache.o is, so that it is rebuilt when a make asks for the other.
# MEMCACHED=0, no, off or false is off; 1, yes, on or true insists.
MEMCACHED_ASKED := $(strip $(MEMCACHED))
ifneq ($(filter-out 0 no off false 1 yes on true,$(MEMCACHED_ASKED)),)
$(error MEMCACHED=$(MEMCACHED): say 1 (yes, on, true) or 0 (no, off, false), or leave it unset to detect libmemcached)
endif
MEMCACHED_BUILD := off
ifeq ($(filter 0 no off false,$(MEMCACHED_ASKED)),)
MEMCACHED_BUILD := $(shell $(shell $(PG_CONFIG) --cc) $(shell $(PG_CONFIG) --cppflags) $(CPPFLAGS) \
	-E -include libmemcached/memcached.h -x c /dev/null >/dev/null 2>&1 && echo on || echo off)
ifneq ($(MEMCACHED_ASKED),)
ifeq ($(MEMCACHED_BUILD),off)
$(error MEMCACHED=$(MEMCACHED), but libmemcached/memcached.h is not found: install libmemcached-dev, or build with make MEMCACHED=0)
endif
endif
endif
ifeq ($(MEMCACHED_BUILD),on)
PG_CPPFLAGS += -DSHARDED_SEQ_MEMCACHED
SHLIB_LINK += -lmemcached
else
# installcheck leaves out the tests that make memcached objects or start a
# memcached: one list of files, for pg_regress, isolation and TAP
MEMCACHED_TESTS := $(shell grep -l "'memcached'\|Memcached" sql/*.sql specs/*.spec t/*.pl 2>/dev/null)
REGRESS := $(filter-out $(patsubst sql/%.sql,%,$(filter sql/%,$(MEMCACHED_TESTS))),$(REGRESS))
ISOLATION := $(filter-out $(patsubst specs/%.spec,%,$(filter specs/%,$(MEMCACHED_TESTS))),$(ISOLATION))
ifdef TAP_TESTS
PROVE_TESTS = $(filter-out $(MEMCACHED_TESTS),$(sort $(wildcard t/*.pl)))
endif
endif
# make -n changes nothing, the stamp included
ifeq ($(findstring n,$(firstword -$(MAKEFLAGS))),)
ifneq ($(MEMCACHED_BUILD),$(shell cat .memcached 2>/dev/null))
$(shell echo $(MEMCACHED_BUILD) > .memcached)
endif
endif
EXTRA_CLEAN += .memcached

PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# the tests' own Perl modules (t/ShardedSeq/)
PG_PROVE_FLAGS += -I $(srcdir)/t

# every object, and the bitcode the server inlines from with JIT, depends on
# the shared headers (PGXS tracks no header changes) and the kind of build
$(OBJS): $(wildcard src/*/*.h) .wait_points
src/common/memcache.o: .memcached
ifeq ($(with_llvm), yes)
$(OBJS:.o=.bc): $(wildcard src/*/*.h) .wait_points
src/common/memcache.bc: .memcached
endif
