/*
 * memcache.c
 *	  The memcached client: one libmemcached handle per backend, built from
 *	  the sharded_seq.memcached_* settings, and a few operations whose
 *	  outcome is reported as what the caller may safely conclude.
 *
 * libmemcached allocates with malloc; nothing it returns outlives the call
 * that copies it, so an ereport never leaks it.  Nothing talks to the network
 * unless sharded_seq.memcached_servers is set.
 *
 * The only file that knows whether the build has libmemcached (the Makefile
 * defines SHARDED_SEQ_MEMCACHED when it does).  Without it the servers must
 * stay empty, so McEnabled() is always false and callers take the paths they
 * take when no server is set; asking for the memcached tier or mode is
 * refused (McRequireBuilt), and the requests, never reached, send nothing.
 */
#include "postgres.h"

#include <errno.h>
#include <inttypes.h>
#ifdef SHARDED_SEQ_MEMCACHED
#include <libmemcached/memcached.h>
#define MC_BUILT true
#else
#define MC_BUILT false
#endif

#include "access/xlog.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "common/common.h"

#define MC_BUILD_HINT "Rebuild sharded_seq with libmemcached-dev installed (make MEMCACHED=1)."

char	   *MemcachedServers = NULL;
int			MemcachedConnectTimeout = 200;
int			MemcachedPollTimeout = 200;

static TimestampTz LastDown = 0;	/* when a request last found no server */
static TimestampTz LastFailure = 0; /* ... or failed in any way (a timeout) */
static bool HandleStale = true;

/* libmemcached skips a failed server for this long before trying it again */
#define MC_RETRY_SECONDS 1

/*
 * Refuse what needs memcached (what: "tier 'memcached'") in a build without
 * libmemcached.
 */
void
McRequireBuilt(const char *what)
{
	if (!MC_BUILT)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s is not available: sharded_seq was built without libmemcached", what),
				 errhint(MC_BUILD_HINT)));
}

/*
 * A 'memcached' counter's amounts may be in memcached, which this backend
 * cannot reach (no server set, or a build without libmemcached): refuse
 * what would absorb them (a set) or leave them behind (leaving the mode).
 * Flushed once memcached is reached again, they would count on top of a
 * total set without them, above the true sum.
 */
void
McRequireReachable(const char *what, const char *name)
{
	if (McEnabled())
		return;
	if (!MC_BUILT)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot %s counter \"%s\" (mode 'memcached'): sharded_seq was built without libmemcached", what, name),
				 errdetail("Amounts memcached may still hold for it would count on top of the total once a build with libmemcached flushes them."),
				 errhint("On a build with libmemcached, move it to mode 'exact' with sharded_seq.alter_counter(), which flushes memcached's amounts, before switching builds.")));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("cannot %s counter \"%s\" (mode 'memcached'): sharded_seq.memcached_servers is empty", what, name),
			 errdetail("Amounts memcached may still hold for it would count on top of the total once the servers are set again."),
			 errhint("Set sharded_seq.memcached_servers to the servers that hold its amounts (a fresh memcached if they lost them), and try again.")));
}

/* Settings changed: rebuild the handle before its next use (never here). */
void
McSettingsChanged(void)
{
	HandleStale = true;
}

bool
McEnabled(void)
{
	return MC_BUILT && MemcachedServers != NULL && MemcachedServers[0] != '\0';
}

/*
 * Did a request find no server within the retry interval?  Work that
 * cannot wait for an answer (increments decided at commit) then goes to the
 * database instead.
 */
bool
McRecentlyDown(void)
{
	return LastDown != 0 &&
		!TimestampDifferenceExceeds(LastDown, GetCurrentTimestamp(),
									MC_RETRY_SECONDS * 1000);
}

/* When a request of this backend last failed (no server, a timeout), or 0. */
TimestampTz
McLastFailure(void)
{
	return LastFailure;
}

/*
 * "ss:<system id>:<database>:<installation>:<suffix>": no two databases,
 * and no two installations of the extension in one database, share keys.
 * An installation upgraded from 1.0 (token 0) keeps 1.0's keys.
 */
char *
McKey(const char *fmt,...)
{
	char		suffix[200];
	va_list		args;
	uint64		token = InstallationToken();

	va_start(args, fmt);
	vsnprintf(suffix, sizeof(suffix), fmt, args);
	va_end(args);
	if (token == 0)
		return psprintf("ss:" UINT64_FORMAT ":%u:%s", GetSystemIdentifier(),
						MyDatabaseId, suffix);
	return psprintf("ss:" UINT64_FORMAT ":%u:%" PRIx64 ":%s",
					GetSystemIdentifier(), MyDatabaseId, (uint64_t) token, suffix);
}

#ifdef SHARDED_SEQ_MEMCACHED

static memcached_st *Handle = NULL;
/*
 * A second connection, whose increments ask for no reply: an increment after
 * commit then costs a write, not a round trip.  Reads of those amounts by
 * this backend go through it too, so that they come after its increments.
 */
static memcached_st *Quiet = NULL;
static TimestampTz QuietUsed = 0;	/* when a quiet increment was last sent */

/* a quiet connection idle this long is checked before an amount is sent */
#define QUIET_IDLE_MS	500

static memcached_st *
NewHandle(bool quiet)
{
	memcached_st *mc = memcached_create(NULL);
	memcached_server_st *list;

	if (mc == NULL)
		return NULL;
	/* behaviours are set once, here */
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
	/* consistent hashing (ketama, honouring weights): a list change moves few keys */
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, MemcachedConnectTimeout);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, MemcachedPollTimeout);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_SND_TIMEOUT, (uint64_t) MemcachedPollTimeout * 1000);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RCV_TIMEOUT, (uint64_t) MemcachedPollTimeout * 1000);
	/* a server that failed is skipped for a second, not retried on every call */
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, 1);
	memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_SERVER_FAILURE_LIMIT, 1);
	if (quiet)
		memcached_behavior_set(mc, MEMCACHED_BEHAVIOR_NOREPLY, 1);
	list = memcached_servers_parse(MemcachedServers);
	if (list != NULL)
	{
		memcached_server_push(mc, list);
		memcached_server_list_free(list);
	}
	return mc;
}

static memcached_st *
HandleFor(bool quiet)
{
	if (!McEnabled())
		return NULL;
	if (HandleStale)
	{
		if (Handle != NULL)
			memcached_free(Handle);
		if (Quiet != NULL)
			memcached_free(Quiet);
		Handle = Quiet = NULL;
		HandleStale = false;
	}
	if (quiet && Quiet == NULL)
		Quiet = NewHandle(true);
	if (!quiet && Handle == NULL)
		Handle = NewHandle(false);
	return quiet ? Quiet : Handle;
}

static memcached_st *
McHandle(void)
{
	return HandleFor(false);
}

/*
 * What a failed call lets the caller conclude.  Only errors raised before a
 * request can have left are "down"; a timeout may hide a request the server
 * did apply (libmemcached even reports some as NOTFOUND), so it is "unknown".
 */
static McResult
ClassifyReturn(memcached_st *mc, memcached_return_t rc)
{
	switch (rc)
	{
		case MEMCACHED_SUCCESS:
		case MEMCACHED_STORED:
		case MEMCACHED_DELETED:
			return MC_OK;
		case MEMCACHED_NOTFOUND:
			return MC_MISSING;
		case MEMCACHED_NOTSTORED:
		case MEMCACHED_DATA_EXISTS:
			return MC_EXISTS;
		case MEMCACHED_NO_SERVERS:
		case MEMCACHED_SERVER_MARKED_DEAD:
		case MEMCACHED_SERVER_TEMPORARILY_DISABLED:
		case MEMCACHED_HOST_LOOKUP_FAILURE:
		case MEMCACHED_CONNECTION_SOCKET_CREATE_FAILURE:
			return MC_DOWN;
		case MEMCACHED_CONNECTION_FAILURE:
			return memcached_last_error_errno(mc) == ECONNREFUSED ? MC_DOWN : MC_UNKNOWN;
		default:
			return MC_UNKNOWN;
	}
}

static McResult
ClassifyOn(memcached_st *mc, memcached_return_t rc)
{
	McResult	r = ClassifyReturn(mc, rc);

	if (r == MC_DOWN)
		LastDown = GetCurrentTimestamp();
	if (r == MC_DOWN || r == MC_UNKNOWN)
		LastFailure = GetCurrentTimestamp();
	return r;
}

static McResult
Adjust(bool up, const char *key, uint64 delta, uint64 *newvalue)
{
	memcached_st *mc = McHandle();
	uint64_t	v = 0;
	memcached_return_t rc;

	/* libmemcached takes 32-bit deltas: callers keep within MC_MAX_DELTA */
	if (delta > MC_MAX_DELTA)
		elog(ERROR, "memcached delta " UINT64_FORMAT " is out of range", delta);
	if (mc == NULL)
		return MC_DOWN;
	if (up)
		rc = memcached_increment(mc, key, strlen(key), (uint32_t) delta, &v);
	else
		rc = memcached_decrement(mc, key, strlen(key), (uint32_t) delta, &v);
	*newvalue = v;
	return ClassifyOn(mc, rc);
}

McResult
McIncr(const char *key, uint64 delta, uint64 *newvalue)
{
	return Adjust(true, key, delta, newvalue);
}

McResult
McDecr(const char *key, uint64 delta, uint64 *newvalue)
{
	return Adjust(false, key, delta, newvalue);
}

/* Read a decimal value; anything unparsable counts as unknown. */
static McResult
GetOn(memcached_st *mc, const char *key, int64 *value)
{
	size_t		len = 0;
	uint32_t	flags = 0;
	memcached_return_t rc;
	char	   *raw;
	char		buf[32];
	char	   *end;

	if (mc == NULL)
		return MC_DOWN;
	raw = memcached_get(mc, key, strlen(key), &len, &flags, &rc);
	if (raw == NULL)
		return rc == MEMCACHED_SUCCESS ? MC_UNKNOWN : ClassifyOn(mc, rc);
	/* copy out and free before anything can ereport */
	if (len >= sizeof(buf))
		len = 0;
	memcpy(buf, raw, len);
	buf[len] = '\0';
	free(raw);
	/* memcached counters may carry trailing spaces after a decr */
	errno = 0;
	*value = strtoll(buf, &end, 10);
	while (*end == ' ')
		end++;
	if (len == 0 || errno != 0 || *end != '\0')
		return MC_UNKNOWN;
	return MC_OK;
}

McResult
McGet(const char *key, int64 *value)
{
	return GetOn(McHandle(), key, value);
}

/* McGet on the connection of this backend's quiet increments, after them. */
McResult
McGetAfterOwn(const char *key, int64 *value)
{
	return GetOn(HandleFor(true), key, value);
}

/*
 * Add delta to a key, creating it at delta if missing, without waiting for
 * a reply.  MC_OK means the request was written; a server that dies before
 * reading it loses it.  MC_DOWN means nothing was sent.
 */
McResult
McIncrQuiet(const char *key, uint64 delta)
{
	memcached_st *mc = HandleFor(true);
	uint64_t	unused;
	TimestampTz now = GetCurrentTimestamp();
	McResult	r;

	if (mc == NULL)
		return MC_DOWN;

	/*
	 * A server restarted while this connection sat idle left it closed at the
	 * other end, and a quiet request written to it fails after it was sent:
	 * an unknown outcome, so a lost amount, although the new server never saw
	 * it.  An idle connection is first asked with a read, whose failure sends
	 * nothing: the amount then goes elsewhere (MC_DOWN).
	 */
	if (TimestampDifferenceExceeds(QuietUsed, now, QUIET_IDLE_MS))
	{
		int64		ignored;
		McResult	probe = GetOn(mc, key, &ignored);

		if (probe != MC_OK && probe != MC_MISSING)
			return MC_DOWN;
	}
	r = ClassifyOn(mc, memcached_increment_with_initial(mc, key, strlen(key), delta, delta,
														0, &unused));
	if (r == MC_OK)
		QuietUsed = now;
	return r;
}

static McResult
Store(bool add, const char *key, int64 value, time_t expiry)
{
	memcached_st *mc = McHandle();
	char		buf[32];
	int			len;

	if (mc == NULL)
		return MC_DOWN;
	len = snprintf(buf, sizeof(buf), INT64_FORMAT, value);
	return ClassifyOn(mc, add ? memcached_add(mc, key, strlen(key), buf, len, expiry, 0)
					  : memcached_set(mc, key, strlen(key), buf, len, expiry, 0));
}

McResult
McAdd(const char *key, int64 value, time_t expiry)
{
	return Store(true, key, value, expiry);
}

McResult
McSet(const char *key, int64 value, time_t expiry)
{
	return Store(false, key, value, expiry);
}

/*
 * Probe each configured server with its own short-lived handle.  Calls
 * report(name, port, healthy, detail) for each.
 */
void
McProbeServers(void (*report) (const char *, int, bool, const char *, void *), void *arg)
{
	memcached_st *mc = McHandle();
	uint32_t	n;

	if (mc == NULL)
		return;
	n = memcached_server_count(mc);
	for (uint32_t i = 0; i < n; i++)
	{
		const memcached_instance_st *inst = memcached_server_instance_by_position(mc, i);
		char		name[256];
		int			port = memcached_server_port(inst);
		memcached_st *probe;
		memcached_return_t rc;
		char	   *version_detail;

		strlcpy(name, memcached_server_name(inst), sizeof(name));
		probe = memcached_create(NULL);
		memcached_behavior_set(probe, MEMCACHED_BEHAVIOR_BINARY_PROTOCOL, 1);
		memcached_behavior_set(probe, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, MemcachedConnectTimeout);
		memcached_behavior_set(probe, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, MemcachedPollTimeout);
		memcached_server_add(probe, name, port);
		rc = memcached_version(probe);
		version_detail = pstrdup(memcached_strerror(probe, rc));
		memcached_free(probe);
		report(name, port, rc == MEMCACHED_SUCCESS, version_detail, arg);
	}
}

#else							/* !SHARDED_SEQ_MEMCACHED */

/*
 * Without libmemcached no server is ever set (McCheckServers), so callers,
 * which ask McEnabled() first, never get here; if one did, nothing is sent,
 * as when no server answers.  No ereport: some callers run after commit.
 */
McResult
McIncr(const char *key, uint64 delta, uint64 *newvalue)
{
	*newvalue = 0;
	return MC_DOWN;
}

McResult
McDecr(const char *key, uint64 delta, uint64 *newvalue)
{
	*newvalue = 0;
	return MC_DOWN;
}

McResult
McGet(const char *key, int64 *value)
{
	return MC_DOWN;
}

McResult
McGetAfterOwn(const char *key, int64 *value)
{
	return MC_DOWN;
}

McResult
McIncrQuiet(const char *key, uint64 delta)
{
	return MC_DOWN;
}

McResult
McAdd(const char *key, int64 value, time_t expiry)
{
	return MC_DOWN;
}

McResult
McSet(const char *key, int64 value, time_t expiry)
{
	return MC_DOWN;
}

/* no server to probe: memcached_servers() returns no row */
void
McProbeServers(void (*report) (const char *, int, bool, const char *, void *), void *arg)
{
}

#endif							/* SHARDED_SEQ_MEMCACHED */

/*
 * Check a server list: comma-separated host[:port[:weight]] items, as
 * libmemcached parses them, with hosts made of name characters.
 */
static bool
ServersValid(const char *list, char **why)
{
	char	   *copy;
	char	   *item;

	if (list == NULL || list[0] == '\0')
		return true;
	copy = pstrdup(list);
	item = copy;
	for (;;)
	{
		char	   *comma = strchr(item, ',');
		char	   *host = item;
		char	   *colon;
		long		port;
		char	   *end;

		if (comma)
			*comma = '\0';
		while (*host == ' ')
			host++;
		if (*host == '\0')
		{
			*why = psprintf("An empty server name appears in \"%s\".", list);
			return false;
		}
		colon = strchr(host, ':');
		for (char *c = host; c < (colon ? colon : host + strlen(host)); c++)
			if (!(isalnum((unsigned char) *c) || *c == '.' || *c == '-' || *c == '_'))
			{
				*why = psprintf("\"%s\" is not a host name.", host);
				return false;
			}
		if (colon)
		{
			errno = 0;
			port = strtol(colon + 1, &end, 10);
			if (errno != 0 || end == colon + 1 || port < 1 || port > 65535 ||
				(*end != '\0' && *end != ':'))
			{
				*why = psprintf("\"%s\" does not name a port between 1 and 65535.", host);
				return false;
			}
		}
		if (comma == NULL)
			break;
		item = comma + 1;
	}
	return true;
}

/*
 * The check hook's answer for sharded_seq.memcached_servers, with its
 * GUC_check_err* reasons.  A build without libmemcached takes only the empty
 * list: a postgresql.conf that names servers then draws a warning when the
 * library loads (the setting stays empty), and SET or ALTER SYSTEM is
 * refused.
 */
bool
McCheckServers(const char *list)
{
	char	   *why = NULL;

	if (!MC_BUILT && list != NULL && list[0] != '\0')
	{
		GUC_check_errcode(ERRCODE_FEATURE_NOT_SUPPORTED);
		GUC_check_errmsg("memcached servers cannot be set: sharded_seq was built without libmemcached");
		GUC_check_errdetail("sharded_seq.memcached_servers can only be empty in this build.");
		GUC_check_errhint(MC_BUILD_HINT);
		return false;
	}
	if (ServersValid(list, &why))
		return true;
	GUC_check_errcode(ERRCODE_INVALID_PARAMETER_VALUE);
	GUC_check_errdetail("%s", why);
	GUC_check_errhint("Give a comma-separated list of host:port, such as '127.0.0.1:11211,10.0.0.5:11211'.");
	return false;
}
