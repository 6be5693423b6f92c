"""From kernel_gate_up.py's sweep JSON: the best tiling per batch as a GATE_UP_SILU_TABLE
(JSON [[most_rows, config], ...]; neighbouring batches with the same best merged), and a
one-line summary per batch."""
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
table = []
for row in rows:
    best = row.get("best", row["fused"])
    cfg = {k: best["config"][k] for k in ("block_m", "block_n", "block_k", "num_warps", "num_stages")}
    print(f"M{row['m']:4d} apart {row['apart_us']:6.2f} cublas {row['cublas_us']:6.2f} "
          f"fused(default) {row['fused']['us']:6.2f} best {best['us']:6.2f} "
          f"gain {row['apart_us'] - best['us']:+6.2f} {cfg}")
    if table and table[-1][1] == cfg:
        table[-1][0] = row["m"]
    else:
        table.append([row["m"], cfg])
table[-1][0] = 1 << 30
json.dump(table, open(sys.argv[2], "w"))
print(json.dumps(table))
