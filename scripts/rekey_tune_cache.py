"""Carry a tuning cache across a kernel edit that does not change what the tilings mean (a
refactor of the shared pieces): every entry is re-keyed to its variant's current source hash.
Entries of variants that no longer exist are dropped. Only for edits you have verified do not
change which tiling is fastest; otherwise tune afresh.

Usage: python scripts/rekey_tune_cache.py CACHE.json (your cache, or convlab's shipped tunings:
convlab/assets/tunings.json, which a CPU test holds to today's source hashes)
"""

import json
import sys

from convlab import tuning
from convlab.kernels import VARIANTS

if len(sys.argv) != 2:
    sys.exit(__doc__)
path = sys.argv[1]
with open(path) as f:
    cache = json.load(f)
entries = {}
for key, entry in cache["entries"].items():
    variant = VARIANTS.get(entry["variant"])
    if variant is None:
        continue
    digest = tuning.source_hash(variant)
    parts = key.split(" | ")
    parts[2] = digest
    entries[" | ".join(parts)] = {**entry, "source_hash": digest}
changed = sum(k not in cache["entries"] for k in entries)
with open(path, "w") as f:
    json.dump({**cache, "entries": entries}, f, indent=1)
print(f"{len(entries)} entries, {changed} re-keyed -> {path}")
