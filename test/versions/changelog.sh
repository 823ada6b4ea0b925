#!/usr/bin/env bash
# CHANGELOG.md has a section "## X.Y (date)" for the control file's
# default_version and for every version the install scripts reach from the
# base script (t/ShardedSeq/Versions.pm), newest first, each with at least
# one line of text; an "## Unreleased" section may come first.  A version
# bump without its entry fails here.  No server: it reads files.
set -euo pipefail
cd "$(dirname "$0")/../.."
versions="$(perl -I t -MShardedSeq::Versions \
    -e 'print join(" ", ShardedSeq::Versions::install_versions_in(".")), "\n"')"
python3 - $versions <<'PY'
import re, sys
default, base, reached = sys.argv[1], sys.argv[2], sys.argv[3:]
text = open("CHANGELOG.md").read()
bad = []
heads = list(re.finditer(r'^## (.+)$', text, re.M))
sections, unreleased_at = [], None
for i, m in enumerate(heads):
    body = text[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(text)]
    if m.group(1) == "Unreleased":
        unreleased_at = i
        continue
    v = re.fullmatch(r'(\d+(?:\.\d+)*) \((\d{4}-\d\d-\d\d|unreleased)\)', m.group(1))
    if not v:
        bad.append(f"CHANGELOG.md: a section head that is not '## X.Y (YYYY-MM-DD)': {m.group(0)!r}")
        continue
    if not body.strip():
        bad.append(f"CHANGELOG.md: the section of {v.group(1)} is empty")
    sections.append(v.group(1))
if unreleased_at not in (None, 0):
    bad.append("CHANGELOG.md: '## Unreleased' must be the first section")
for v in [default] + reached:
    if v not in sections:
        bad.append(f"CHANGELOG.md has no section '## {v} (date)'"
                   + (" (the control file's default_version)" if v == default else ""))
key = lambda v: [int(x) for x in v.split('.')]
if sections != sorted(sections, key=key, reverse=True):
    bad.append(f"CHANGELOG.md: the sections are not newest first: {' '.join(sections)}")
if len(set(sections)) != len(sections):
    bad.append("CHANGELOG.md: a version has two sections")
for b in bad:
    print("FAILED:", b)
if bad:
    sys.exit(1)
print(f"RESULT CHANGELOG.md: a section for each of {' '.join(sections)}; default_version {default}")
PY
