#!/usr/bin/env bash
# The layering of src/ (scripts/layers.py), common < topology < sequence,
# counter < worker < module.c: lower subsystems never include a higher one's
# header, a folder is entered only through its door, and no include cycle
# exists; and the built objects call only their own folder or a lower layer,
# with no circle of calls between files.  The checker first proves on small
# trees (and on small objects it compiles) that it catches each kind of
# violation.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 scripts/layers.py --self-test
out="$(python3 scripts/layers.py --objects src)" || { echo "$out"; echo "FAILED: the layering is broken"; exit 1; }
echo "RESULT $(echo "$out" | tail -n 1)"
