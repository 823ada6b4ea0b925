/*
 * privileges.c
 *	  Running as the extension's owner, and the privileges of sequences and
 *	  counters: their ACLs (aclitem[] columns of the config tables), checks,
 *	  grants and revokes.  The admin functions are SECURITY INVOKER C code
 *	  that acts as the owner inside SPI and checks the caller's rights here.
 */
#include "postgres.h"

#include "catalog/pg_authid.h"

#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "common/common.h"

/*
 * Act as the extension's owner inside SPI, remembering the caller, whose
 * rights the functions check themselves.
 */
void
BeginAsOwner(OwnerContext *ctx)
{
	Oid			owner = ExtensionOwner();

	/* the extension is used here (it exists: its owner was found) */
	RegistryNoteUse();
	GetUserIdAndSecContext(&ctx->saved_user, &ctx->saved_context);
	ctx->caller = ctx->saved_user;
	SetUserIdAndSecContext(owner,
						   ctx->saved_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);

	/*
	 * The caller's search_path must not pick the operators and functions
	 * our plans run with the owner's rights.  The nest level is undone here,
	 * or by the (sub)transaction abort if anything raises an error.
	 */
	ctx->guc_nest_level = NewGUCNestLevel();
	(void) set_config_option("search_path", "pg_catalog, pg_temp",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	SPI_connect();
}

void
EndAsOwner(OwnerContext *ctx)
{
	SPI_finish();
	AtEOXact_GUC(true, ctx->guc_nest_level);
	SetUserIdAndSecContext(ctx->saved_user, ctx->saved_context);
}

static const char *
PrivilegeName(AclMode mode)
{
	if (mode & ACL_UPDATE)
		return "update";
	if (mode & ACL_SELECT)
		return "select";
	return "usage";
}

/* Does role hold one of the rights in mode on an object? */
bool
HasPrivilege(Oid owner, Acl *acl, Oid role, AclMode mode)
{
	Acl		   *effective = acl ? acl : acldefault(OBJECT_SEQUENCE, owner);

	return aclmask(effective, role, owner, mode, ACLMASK_ANY) != 0;
}

/*
 * May role see a sharded sequence's positions (generation_start,
 * reserved_high_water)?  As pg_sequences shows last_value: to the owner's
 * members and to holders of usage (or select).
 */
/*
 * May role see monitoring figures of objects it may not otherwise read?
 * pg_read_all_stats may, as pg_stat_statements shows it every query.
 */
bool
StatsReader(Oid role)
{
	return has_privs_of_role(role, ROLE_PG_READ_ALL_STATS);
}

bool
SequenceReadable(Oid owner, Acl *acl, Oid role)
{
	return has_privs_of_role(role, owner) ||
		HasPrivilege(owner, acl, role, ACL_USAGE | ACL_SELECT);
}

/* Raise 42501 unless the current user holds one of the rights in mode. */
void
CheckPrivilege(ObjectKind kind, const char *name, Oid owner, Acl *acl,
			   AclMode mode)
{
	Oid			user = GetUserId();

	if (HasPrivilege(owner, acl, user, mode))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for %s \"%s\"", KindName(kind), name),
			 errhint("The owner can run sharded_seq.grant_%s('%s', '%s', '%s').",
					 kind == KIND_SEQUENCE ? "sequence" : "counter", name,
					 GetUserNameFromId(user, false), PrivilegeName(mode))));
}

/* An owner's name, or its OID if the role was dropped. */
static const char *
OwnerName(Oid owner)
{
	char	   *name = GetUserNameFromId(owner, true);

	return name ? name : psprintf("%u", owner);
}

/* Raise 42501 unless role is owner (or a member of the owning role). */
void
CheckOwnership(ObjectKind kind, const char *name, Oid owner, Oid role)
{
	if (has_privs_of_role(role, owner))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("must be owner of %s \"%s\"", KindName(kind), name),
			 errhint("Connect as role \"%s\" or a member of it.",
					 OwnerName(owner))));
}

static AclMode
ParsePrivileges(ObjectKind kind, const char *privilege)
{
	if (kind == KIND_SEQUENCE && pg_strcasecmp(privilege, "usage") == 0)
		return ACL_USAGE;
	if (kind == KIND_SEQUENCE && pg_strcasecmp(privilege, "all") == 0)
		return ACL_USAGE;
	if (kind == KIND_COUNTER && pg_strcasecmp(privilege, "select") == 0)
		return ACL_SELECT;
	if (kind == KIND_COUNTER && pg_strcasecmp(privilege, "update") == 0)
		return ACL_UPDATE;
	if (kind == KIND_COUNTER && pg_strcasecmp(privilege, "all") == 0)
		return ACL_SELECT | ACL_UPDATE;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_GRANT_OPERATION),
			 errmsg("unknown privilege \"%s\" for a %s", privilege, KindName(kind)),
			 errhint("%s", kind == KIND_SEQUENCE ?
					 "Sequences take 'usage' (or 'all')." :
					 "Counters take 'select', 'update' or 'all'.")));
	return 0;					/* keep compiler quiet */
}

/* Grant or revoke privilege for grantee ('public' or a role) on one object. */
Acl *
ChangeAcl(ObjectKind kind, const char *name, Oid owner, Acl *acl,
		  const char *grantee, const char *privilege, bool grant)
{
	AclItem		item;
	Oid			grantee_id;

	if (pg_strcasecmp(grantee, "public") == 0)
		grantee_id = ACL_ID_PUBLIC;
	else
	{
		grantee_id = get_role_oid(grantee, true);
		if (!OidIsValid(grantee_id))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("role \"%s\" does not exist", grantee),
					 errhint("Create the role first, or name 'public'.")));
	}
	item.ai_grantee = grantee_id;
	item.ai_grantor = owner;
	ACLITEM_SET_PRIVS_GOPTIONS(item, ParsePrivileges(kind, privilege), ACL_NO_RIGHTS);
	if (acl == NULL)
		acl = acldefault(OBJECT_SEQUENCE, owner);
	return aclupdate(acl, &item, grant ? ACL_MODECHG_ADD : ACL_MODECHG_DEL,
					 owner, DROP_RESTRICT);
}

/* Copy an aclitem[] column value to cxt (NULL stays NULL). */
Acl *
CopyAcl(Datum value, bool isnull, MemoryContext cxt)
{
	Acl		   *acl;
	Acl		   *copy;

	if (isnull)
		return NULL;
	acl = DatumGetAclP(value);
	copy = MemoryContextAlloc(cxt, VARSIZE(acl));
	memcpy(copy, acl, VARSIZE(acl));
	return copy;
}
