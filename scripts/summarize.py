"""Print a compact table of saved compare records: per layer and batch, each variant's median."""

import json
import sys
from pathlib import Path

for path in sorted(Path(sys.argv[1]).glob("compare-*.json")):
    record = json.loads(path.read_text())
    subject = record['model'] or f"layer {record['rows'][0]['shape']}"
    print(f"== {subject} on {record['device']['name']}")
    rows = record["rows"]
    for key in dict.fromkeys((r["batch"], r["label"]) for r in rows):
        cells = []
        for r in rows:
            if (r["batch"], r["label"]) != key:
                continue
            t = r["timing"]["median_ms"] if r["status"] == "PASS" and r["timing"] else None
            cells.append(f"{r['variant']}={t:.3f}" if t else f"{r['variant']}={r['status']}")
        print(f"B={key[0]} {key[1]}: " + " ".join(cells))
