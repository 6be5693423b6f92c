"""From kernel_gate_up.py's sweep JSON: the row limit (the largest batch up to which the
best fused tiling beats cuBLAS + the activation kernel at every swept batch) and the
table of best tilings up to it (neighbours with the same best merged)."""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
table, limit = [], 0
for row in rows:
    best = row.get("best", row["fused"])
    cfg = {k: best["config"][k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
    wins = best["us"] < row["apart_us"]
    print(f"M{row['m']:4d} apart {row['apart_us']:6.2f} cublas {row['cublas_us']:6.2f} "
          f"best {best['us']:6.2f} gain {row['apart_us'] - best['us']:+6.2f} {cfg}")
    if not wins:
        break
    limit = row["m"]
    if table and table[-1][1] == cfg:
        table[-1][0] = row["m"]
    else:
        table.append([row["m"], cfg])
if table:
    table[-1][0] = 1 << 30
json.dump(table, open(sys.argv[2], "w"))
open(sys.argv[3], "w").write(str(limit))
print("limit", limit, json.dumps(table))
