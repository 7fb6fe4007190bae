import json, glob, sys, statistics
# median over rounds of each binary's rate per (mode, tracked, phase); ratio = untracked/tracked
def load(which):
    rates = {}; uploads = {}; tps = {}
    for path in sorted(glob.glob(f"/tmp/store-exp/cmp-{which}-*/results/results.json")):
        d = json.load(open(path))
        for p in d["kv"]:
            if p["threads"] != 1: continue
            m = p["mode"]["durability"] + (" (RAM disk)" if p["mode"]["ram_disk"] else "")
            rates.setdefault((m, p["tracked"], p["phase"]), []).extend(p["records_per_second"])
            if p["upload_ms"]: uploads.setdefault((m, p["phase"]), []).extend(p["upload_ms"])
        for p in d["tpcb"]:
            if p["threads"] != 1: continue
            m = p["mode"]["durability"] + (" (RAM disk)" if p["mode"]["ram_disk"] else "")
            tps.setdefault((m, p["tracked"]), []).extend(p["tps"])
    return rates, uploads, tps
b, bu, bt = load("before"); a, au, at = load("after")
modes = ["normal", "off", "memory", "full (RAM disk)"]
phases = ["Insert", "Update", "Delete", "Reinsert"]
med = statistics.median
print("Tracked cost / untracked cost (x), one thread, 20,000 records; median of %d runs each, before -> after" % len(b[("normal", False, "Insert")]))
print(f"{'mode':18}" + "".join(f"{p.lower():>22}" for p in phases) + f"{'TPC-B TPS tracked':>26}")
for m in modes:
    cells = []
    for p in phases:
        rb = med(b[(m, False, p)]) / med(b[(m, True, p)]); ra = med(a[(m, False, p)]) / med(a[(m, True, p)])
        cells.append(f"x{rb:.2f} -> x{ra:.2f}")
    t = f"{med(bt[(m, True)]):.0f} -> {med(at[(m, True)]):.0f}"
    print(f"{m:18}" + "".join(f"{c:>22}" for c in cells) + f"{t:>26}")
print()
print("Tracked rates, records/s, before -> after (untracked before / after for scale)")
for m in modes:
    print(f"{m:18}" + "".join(f"{med(b[(m, True, p)]):>9.0f} ->{med(a[(m, True, p)]):>8.0f} ({med(b[(m, False, p)]):.0f}/{med(a[(m, False, p)]):.0f})" for p in phases))
print()
print("The sync after each phase, ms, before -> after")
for m in modes:
    print(f"{m:18}" + "".join(f"{p.lower():>9} {med(bu[(m, p)]):>7.0f} -> {med(au[(m, p)]):>5.0f}" for p in phases))
