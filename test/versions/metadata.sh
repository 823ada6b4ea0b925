#!/usr/bin/env bash
# The release metadata agrees with the control file: META.json (PGXN) is
# valid, names an install script that exists, and its versions, like the
# Debian package's (debian/changelog), are the control file's default_version.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/../.."
default="$(sed -n "s/^default_version *= *'\(.*\)'/\1/p" sharded_seq.control)"
python3 - "$default" <<'PY'
import json, os, sys
default = sys.argv[1]
m = json.load(open("META.json"))
for key in ("name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"):
    assert key in m, "META.json lacks " + key
p = m["provides"]["sharded_seq"]
assert os.path.exists(p["file"]), "META.json names a missing file " + p["file"]
for v in (m["version"], p["version"]):
    assert v.startswith(default + "."), "META.json version %s is not default_version %s" % (v, default)
assert p["file"] == "sharded_seq--%s.sql" % default, "META.json file is not the default version's script"
print("RESULT META.json: version %s, file %s" % (m["version"], p["file"]))
PY
deb="$(sed -n '1s/^[^(]*(\([^)-]*\).*/\1/p' debian/changelog)"
echo "RESULT debian/changelog: $deb, default_version: $default"
[ "$deb" = "$default" ] || { echo "debian/changelog's version is not default_version"; exit 1; }
