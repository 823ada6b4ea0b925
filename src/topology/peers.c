/*
 * peers.c
 *	  Connections from this backend to the other nodes of a Citus cluster,
 *	  kept open across transactions (one per node and role), for reads that
 *	  each node answers for itself: counter_value's total over the nodes.
 *
 * Citus's own tools (master_run_on_worker) open a new connection per call,
 * which costs a backend start on every node, tens of milliseconds; a kept
 * connection costs one round trip.  A node is reached as Citus reaches it:
 * host and port from pg_dist_node, the settings of citus.node_conninfo, and
 * the password pg_dist_authinfo holds for the role, if any; as the current
 * role, in this database.  Each query runs in a transaction of its own
 * there.  libpq allocates with malloc: every result is cleared before an
 * error is raised, and a connection whose query did not end cleanly (an
 * error, a cancel) is closed.
 */
#include "postgres.h"

#include "libpq-fe.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "topology/topology.h"

typedef struct Peer
{
	int32		nodeid;			/* pg_dist_node.nodeid */
	Oid			role;
	char	   *host;			/* where conn goes, in TopMemoryContext */
	int32		port;
	PGconn	   *conn;
} Peer;

static Peer *Peers = NULL;		/* in TopMemoryContext */
static int	NPeers = 0;
static int	PeersSize = 0;

/* A node to ask, as pg_dist_node lists it. */
typedef struct PeerNode
{
	int32		nodeid;
	char	   *host;
	int32		port;
	char	   *authinfo;		/* pg_dist_authinfo's, or NULL */
	Peer	   *peer;
} PeerNode;

/* Append key=value to a conninfo string, the value quoted for libpq. */
static void
AppendConnOption(StringInfo buf, const char *key, const char *value)
{
	appendStringInfo(buf, "%s='", key);
	for (const char *p = value; *p; p++)
	{
		if (*p == '\'' || *p == '\\')
			appendStringInfoChar(buf, '\\');
		appendStringInfoChar(buf, *p);
	}
	appendStringInfoString(buf, "' ");
}

/* Close peer's connection; a query still running there is cancelled first. */
static void
ClosePeer(Peer *peer)
{
	if (peer->conn && PQtransactionStatus(peer->conn) == PQTRANS_ACTIVE)
	{
		PGcancel   *cancel = PQgetCancel(peer->conn);
		char		errbuf[256];

		if (cancel)
		{
			(void) PQcancel(cancel, errbuf, sizeof(errbuf));
			PQfreeCancel(cancel);
		}
	}
	if (peer->conn)
		PQfinish(peer->conn);
	peer->conn = NULL;
}

/*
 * Open peer's connection, waiting on the latch so that a cancel or a
 * shutdown ends the wait; gives up after 10 seconds.  The result is in
 * peer->conn, as PQconnectdb leaves it.
 */
static void
Connect(Peer *peer, const char *conninfo)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 10000);
	PostgresPollingStatusType status = PGRES_POLLING_WRITING;

	peer->conn = PQconnectStart(conninfo);
	if (peer->conn == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory"),
				 errdetail("libpq could not start a connection to another node.")));
	PG_TRY();
	{
		while (PQstatus(peer->conn) != CONNECTION_BAD &&
			   status != PGRES_POLLING_OK && status != PGRES_POLLING_FAILED)
		{
			long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

			if (left <= 0)
				break;
			(void) WaitLatchOrSocket(MyLatch,
									 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH |
									 (status == PGRES_POLLING_READING ? WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE),
									 PQsocket(peer->conn), left, PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
			status = PQconnectPoll(peer->conn);
		}
	}
	PG_CATCH();
	{
		ClosePeer(peer);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/* This backend's connection to node, opened if need be. */
static Peer *
PeerFor(PeerNode *node)
{
	Oid			role = GetUserId();
	Peer	   *peer = NULL;
	StringInfoData conninfo;
	const char *node_conninfo;
	char	   *message;

	for (int i = 0; i < NPeers; i++)
		if (Peers[i].nodeid == node->nodeid && Peers[i].role == role)
			peer = &Peers[i];
	if (peer == NULL)
	{
		if (NPeers == PeersSize)
		{
			PeersSize = PeersSize ? 2 * PeersSize : 8;
			Peers = Peers ? repalloc(Peers, PeersSize * sizeof(Peer))
				: MemoryContextAlloc(TopMemoryContext, PeersSize * sizeof(Peer));
		}
		peer = &Peers[NPeers++];
		peer->nodeid = node->nodeid;
		peer->role = role;
		peer->host = NULL;
		peer->conn = NULL;
	}
	/* citus_update_node keeps the node id: a connection to the old host is not the node */
	if (peer->conn && PQstatus(peer->conn) == CONNECTION_OK &&
		peer->port == node->port && strcmp(peer->host, node->host) == 0)
		return peer;
	ClosePeer(peer);
	if (peer->host)
		pfree(peer->host);
	peer->host = MemoryContextStrdup(TopMemoryContext, node->host);
	peer->port = node->port;

	initStringInfo(&conninfo);
	AppendConnOption(&conninfo, "host", node->host);
	appendStringInfo(&conninfo, "port=%d ", node->port);
	AppendConnOption(&conninfo, "dbname", get_database_name(MyDatabaseId));
	AppendConnOption(&conninfo, "user", GetUserNameFromId(role, false));
	appendStringInfoString(&conninfo, "application_name=sharded_seq connect_timeout=10 ");
	node_conninfo = GetConfigOption("citus.node_conninfo", true, false);
	if (node_conninfo && *node_conninfo)
		appendStringInfo(&conninfo, "%s ", node_conninfo);
	if (node->authinfo && *node->authinfo)
		appendStringInfoString(&conninfo, node->authinfo);

	Connect(peer, conninfo.data);
	if (PQstatus(peer->conn) == CONNECTION_OK)
		return peer;
	message = pstrdup(*PQerrorMessage(peer->conn) ? PQerrorMessage(peer->conn) : "no answer within 10 seconds");
	ClosePeer(peer);
	ereport(ERROR,
			(errcode(ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION),
			 errmsg("could not connect to node %s:%d of the Citus cluster", node->host, node->port),
			 errdetail("%s", message),
			 errhint("A total over every node needs every node: bring it back, or remove it from the cluster after moving its counts (sharded_seq.move_node_counts).")));
	return NULL;				/* keep compiler quiet */
}

/* The other active primary nodes that have a node id, with what Citus would connect with. */
static PeerNode *
OtherNodes(int32 own_group, int *n)
{
	Oid			types[3] = {INT4OID, NAMEOID, INT4OID};
	Datum		args[3];
	MemoryContext outer = CurrentMemoryContext;
	OwnerContext ctx;
	PeerNode   *nodes;

	/* pg_dist_authinfo is the owner's (Citus's superuser) to read */
	BeginAsOwner(&ctx);
	args[0] = Int32GetDatum(own_group);
	args[1] = DirectFunctionCall1(namein, CStringGetDatum(GetUserNameFromId(ctx.caller, false)));
	/* a node past the last node id has no counter rows, and would refuse to answer */
	args[2] = Int32GetDatum(SHARDED_SEQ_MAX_NODE);
	if (SPI_execute_with_args("SELECT n.nodeid, n.nodename, n.nodeport,"
							  "       (SELECT a.authinfo FROM pg_catalog.pg_dist_authinfo a"
							  "         WHERE a.nodeid OPERATOR(pg_catalog.=) ANY (ARRAY[n.nodeid, 0])"
							  "           AND a.rolename OPERATOR(pg_catalog.=) ANY (ARRAY[$2, ''::pg_catalog.name])"
							  "         ORDER BY a.nodeid OPERATOR(pg_catalog.<>) 0 DESC, a.rolename OPERATOR(pg_catalog.<>) '' DESC"
							  "         LIMIT 1)"
							  "  FROM pg_catalog.pg_dist_node n"
							  " WHERE n.isactive AND n.noderole OPERATOR(pg_catalog.=) 'primary'"
							  "   AND n.groupid OPERATOR(pg_catalog.<>) $1"
							  "   AND n.groupid OPERATOR(pg_catalog.<=) $3"
							  " ORDER BY n.nodeid",
							  3, types, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not read the nodes of the Citus cluster");
	*n = (int) SPI_processed;
	nodes = MemoryContextAllocZero(outer, Max(*n, 1) * sizeof(PeerNode));
	for (int i = 0; i < *n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		char	   *authinfo = SPI_getvalue(tup, desc, 4);

		nodes[i].nodeid = DatumGetInt32(SPI_getbinval(tup, desc, 1, &isnull));
		nodes[i].host = MemoryContextStrdup(outer, SPI_getvalue(tup, desc, 2));
		nodes[i].port = DatumGetInt32(SPI_getbinval(tup, desc, 3, &isnull));
		nodes[i].authinfo = authinfo ? MemoryContextStrdup(outer, authinfo) : NULL;
	}
	EndAsOwner(&ctx);
	return nodes;
}

/* Wait, interruptibly, until conn's query has its result (or failed). */
static void
WaitForResult(PGconn *conn)
{
	while (PQisBusy(conn))
	{
		int			rc = WaitLatchOrSocket(MyLatch,
										   WL_LATCH_SET | WL_SOCKET_READABLE | WL_EXIT_ON_PM_DEATH,
										   PQsocket(conn), -1L, PG_WAIT_EXTENSION);

		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if ((rc & WL_SOCKET_READABLE) && !PQconsumeInput(conn))
			return;
	}
}

static int128 SumElsewhere(const char *query, const char *arg);

/*
 * The sum of what query (one bigint, $1 = arg) returns on every other active
 * primary node of the cluster, asked at once, over this backend's kept
 * connections; an error if a node does not answer.  0 outside a Citus
 * cluster.
 */
int128
ClusterSumElsewhere(const char *query, const char *arg)
{
	/* a single server: nobody else holds a part */
	if (CitusGroup() < 0)
		return 0;
	return SumElsewhere(query, arg);
}

static int128
SumElsewhere(const char *query, const char *arg)
{
	int			n;
	PeerNode   *nodes = OtherNodes(CitusGroup(), &n);
	int128		sum = 0;
	const char *params[1] = {arg};
	volatile int asked = 0;

	PG_TRY();
	{
		for (int i = 0; i < n; i++)
		{
			nodes[i].peer = PeerFor(&nodes[i]);
			if (!PQsendQueryParams(nodes[i].peer->conn, query, 1, NULL, params, NULL, NULL, 0))
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("could not send a query to node %s:%d of the Citus cluster",
								nodes[i].host, nodes[i].port),
						 errdetail("%s", pchomp(PQerrorMessage(nodes[i].peer->conn))),
						 errhint("A total over every node needs every node: bring it back, or remove it from the cluster after moving its counts (sharded_seq.move_node_counts).")));
			asked = i + 1;
		}
		for (int i = 0; i < n; i++)
		{
			PGconn	   *conn = nodes[i].peer->conn;
			PGresult   *res;
			char	   *value = NULL;
			char	   *message = NULL;

			WaitForResult(conn);
			/* copy what we need, clear every result: nothing malloc'd outlives this */
			while ((res = PQgetResult(conn)) != NULL)
			{
				if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
					value = pstrdup(PQgetvalue(res, 0, 0));
				else if (PQresultStatus(res) != PGRES_TUPLES_OK && message == NULL)
					message = pstrdup(PQresultErrorMessage(res));
				PQclear(res);
			}
			if (value == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_CONNECTION_FAILURE),
						 errmsg("node %s:%d of the Citus cluster did not answer", nodes[i].host, nodes[i].port),
						 errdetail("%s", message ? pchomp(message) : pchomp(PQerrorMessage(conn))),
						 errhint("A total over every node needs every node: bring it back, or remove it from the cluster after moving its counts (sharded_seq.move_node_counts).")));
			sum += DatumGetInt64(DirectFunctionCall1(int8in, CStringGetDatum(value)));
		}
	}
	PG_CATCH();
	{
		/* a connection left in the middle of a query is of no further use */
		for (int i = 0; i < asked; i++)
			if (nodes[i].peer && nodes[i].peer->conn &&
				(PQisBusy(nodes[i].peer->conn) || PQtransactionStatus(nodes[i].peer->conn) != PQTRANS_IDLE ||
				 PQstatus(nodes[i].peer->conn) != CONNECTION_OK))
				ClosePeer(nodes[i].peer);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return sum;
}
