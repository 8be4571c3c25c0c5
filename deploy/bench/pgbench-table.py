#!/usr/bin/env python3
"""Markdown table of a bench-pgbench run:
pgbench-table.py RESULTS.tsv CONDITIONS.txt TARGET...

TARGETs in the order to print: direct, pgbouncer, then the pgtender labels.
Every line of RESULTS.tsv is used, failed cells included. A cell's median tps
and latency are over the rounds where pgbench succeeded ("2 of 3" when some
failed, "failed" when all did); the per-round columns show every round, a
failed one as "failed". "x PgBouncer" and "x direct" are the target's median
tps over PgBouncer's and direct's; "+ms vs direct" is its median latency minus
direct's. "failed tx" sums pgbench's failed transactions over the rounds, and
"rounds failed" counts the rounds whose pgbench exited non-zero. "CPU us/tx" is
the median pooler-process CPU (utime+stime) per transaction. With two or more
pgtender targets, a second table gives each later one's tps over the first's,
paired round by round (both measured within seconds of each other).
"""
import csv
import statistics
import sys


def num(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def tps(x):
    return "-" if x is None else f"{x:,.0f}"


def ms(x):
    return "-" if x is None else f"{x:.3f}"


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


def main():
    path, cond, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    rows = list(csv.DictReader(open(path), delimiter="\t"))
    cells = {}  # (mode, clients) -> target -> [row in round order]
    for r in rows:
        cells.setdefault((r["mode"], int(r["clients"])), {}).setdefault(r["target"], []).append(r)
    rounds = sorted({int(r["round"]) for r in rows})
    pgt = [t for t in targets if t not in ("direct", "pgbouncer")]

    print("## pgbench -S: direct, PgBouncer and pgtender in the same run\n")
    for line in open(cond):
        if line.startswith(("commit", "date", "poolers", "pgtender", "pgbouncer", "pgbench", "postgres", "nproc", "uptime")):
            print(f"    {line.rstrip()}")
    print()
    print("| -M | -c | target | tps (median) | x PgBouncer | x direct | latency ms (median) | +ms vs direct "
          "| failed tx | rounds failed | CPU us/tx | tps per round | latency ms per round |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for (mode, clients) in cells:  # file order: modes, then client counts, as run
        per = cells[(mode, clients)]
        med = {}
        for t in targets:
            ok = [r for r in per.get(t, []) if r["status"] == "ok"]
            med[t] = (median([num(r["tps"]) for r in ok]), median([num(r["latency_ms"]) for r in ok]))
        for t in targets:
            rs = per.get(t, [])
            ok = [r for r in rs if r["status"] == "ok"]
            m_tps, m_lat = med[t]
            nfail = len(rs) - len(ok)
            label = tps(m_tps) if ok else "failed"
            if ok and nfail:
                label += f" ({len(ok)} of {len(rs)})"
            pgb = ratio(m_tps, med["pgbouncer"][0])
            dr = ratio(m_tps, med["direct"][0])
            added = "-" if m_lat is None or med["direct"][1] is None or t == "direct" else f"{m_lat - med['direct'][1]:+.3f}"
            ftx = sum(int(r["failed"]) for r in rs if r["failed"].isdigit())
            cpu = median([num(r["cpu_us_per_xact"]) for r in ok])
            by_round = {int(r["round"]): r for r in rs}
            per_tps = " / ".join(tps(num(by_round[i]["tps"])) if i in by_round and by_round[i]["status"] == "ok"
                                 else ("failed" if i in by_round else "-") for i in rounds)
            per_lat = " / ".join(ms(num(by_round[i]["latency_ms"])) if i in by_round and by_round[i]["status"] == "ok"
                                 else ("failed" if i in by_round else "-") for i in rounds)
            print(f"| {mode} | {clients} | {t} | {label} | {pgb} | {dr} | {ms(m_lat)} | {added} | {ftx} | {nfail} "
                  f"| {'-' if cpu is None else f'{cpu:.0f}'} | {per_tps} | {per_lat} |")

    if len(pgt) >= 2:
        base = pgt[0]
        print(f"\nPaired by round: each pgtender's tps over {base}'s in the same round\n")
        print("| -M | -c | target | " + " | ".join(f"round {i}" for i in rounds) + " | median |")
        print("|---|---|---|" + "---:|" * (len(rounds) + 1))
        for (mode, clients), per in cells.items():
            b = {int(r["round"]): r for r in per.get(base, [])}
            for t in pgt[1:]:
                o = {int(r["round"]): r for r in per.get(t, [])}
                vals = []
                for i in rounds:
                    if i in b and i in o and b[i]["status"] == "ok" and o[i]["status"] == "ok" and num(b[i]["tps"]):
                        vals.append(num(o[i]["tps"]) / num(b[i]["tps"]))
                    else:
                        vals.append(None)
                m = median(vals)
                print(f"| {mode} | {clients} | {t}/{base} | " + " | ".join("failed" if v is None else f"{v:.2f}" for v in vals)
                      + f" | {'-' if m is None else f'{m:.2f}'} |")

    loads = [num(r["load1"]) for r in rows]
    loads = [v for v in loads if v is not None]
    if loads:
        print(f"\n1-minute load average at the cells' starts: {min(loads):.2f} to {max(loads):.2f} "
              f"(median {statistics.median(loads):.2f}) on {len(rows)} cells.")


if __name__ == "__main__":
    main()
