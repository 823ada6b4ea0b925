#!/usr/bin/env bash
# The release metadata agrees with the control file and the install scripts:
# META.json (PGXN) is valid, its file is the base install script that the
# update chain starts from (sharded_seq--1.0.sql: every version installs as
# it plus the update scripts, as in contrib) and that chain reaches the
# default_version, and its versions, like the Debian package's
# (debian/changelog), are the control file's default_version.  The license
# agrees everywhere: LICENSE is the PostgreSQL License, META.json says
# "postgresql" (PGXN's name for it), and debian/copyright (DEP-5) gives every
# file License: PostgreSQL with the same text.
set -euo pipefail
cd "$(dirname "$0")/../.."
# default_version, the base version, and every version the chain reaches
versions="$(perl -I t -MShardedSeq::Versions \
    -e 'print join(" ", ShardedSeq::Versions::install_versions_in(".")), "\n"')"
default="${versions%% *}"
python3 - $versions <<'PY'
import json, os, sys
default, base_version, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
m = json.load(open("META.json"))
for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    assert key in m, "META.json lacks " + key
# PGXN's Meta Spec has one version; a validator checks the file against the one it claims
assert m["meta-spec"]["version"] == "1.0.0", "META.json claims meta-spec %s; PGXN's is 1.0.0" % m["meta-spec"]["version"]
p = m["provides"]["sharded_seq"]
assert os.path.exists(p["file"]), "META.json names a missing file " + p["file"]
for v in (m["version"], p["version"]):
    assert v.startswith(default + "."), "META.json version %s is not default_version %s" % (v, default)
base = "sharded_seq--%s.sql" % base_version
assert p["file"] == base, "META.json file %s is not the base install script %s" % (p["file"], base)
assert default in versions, "the update chain from %s does not reach %s: %s" % (base, default, versions)
guard = '\\echo Use "CREATE EXTENSION sharded_seq" to load this file. \\quit'
assert guard in open(base).read().splitlines(), base + " lacks the line " + guard
# the PostgreSQL License, the same text in LICENSE and debian/copyright
assert m["license"] == "postgresql", "META.json license %r is not postgresql" % m["license"]
words = lambda t: " ".join(t.split())
lic = open("LICENSE").read()
grant = "Permission to use, copy, modify, and distribute this software and its documentation for any purpose, without fee, and without a written agreement is hereby granted"
assert grant in words(lic), "LICENSE is not the PostgreSQL License"
assert lic.startswith("Copyright (c) "), "LICENSE does not start with its copyright line"
paras = open("debian/copyright").read().split("\n\n")
files = [p for p in paras if p.startswith("Files:")]
assert files and all("\nLicense: PostgreSQL" in p for p in files), "debian/copyright: a Files paragraph without License: PostgreSQL"
text = [p for p in paras if p.startswith("License: PostgreSQL\n")]
assert len(text) == 1, "debian/copyright has no stand-alone License: PostgreSQL paragraph with its text"
body = "\n".join(l[1:] for l in text[0].splitlines()[1:]).replace("\n.\n", "\n\n")
assert words(body) == words(lic[lic.index("Permission"):]), "debian/copyright's license text is not LICENSE's"
print("RESULT license: PostgreSQL in LICENSE, META.json and debian/copyright")
print("RESULT META.json: version %s, file %s, the base of the chain %s" % (m["version"], p["file"], " ".join(versions)))
PY
deb="$(sed -n '1s/^[^(]*(\([^)-]*\).*/\1/p' debian/changelog)"
echo "RESULT debian/changelog: $deb, default_version: $default"
[ "$deb" = "$default" ] || { echo "debian/changelog's version is not default_version"; exit 1; }
