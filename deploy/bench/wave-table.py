#!/usr/bin/env python3
"""Side-by-side table of a bench-wave run: wave-table.py RUNS.jsonl DURATION_SECONDS.

Every run line is used (failed trials included). C of a peer is the on-time
logins/s of its closed-loop run. "on time/C" = completed_on_time / duration / C.
"refused" = ErrorResponses during login (SQLSTATE counts); loginstorm does not
report the latency of refusals, so none is shown. "conn" = TCP connects
refused/reset/timed out; "tmo" = timeouts at the 5 s deadline; "lag" = the
generator's max dispatch lag and the number of dispatches more than 10 ms late.
"""
import json
import sys


def ms(x):
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


def main():
    path, dur = sys.argv[1], float(sys.argv[2])
    runs = [json.loads(l) for l in open(path) if l.strip()]
    caps, cells, order = {}, {}, []
    for r in runs:
        b = r.get("bench", {})
        peer = b.get("peer")
        if b.get("mult") == "C":
            caps[peer] = r.get("ontime_per_second", 0.0)
            caps[peer + "_run"] = r
            continue
        key = (b.get("backlog"), b.get("mult"))
        if key not in order:
            order.append(key)
        cells[(peer, key)] = r

    print("capacity C (closed loop, 64 workers):")
    for p in ("pgtender", "pgbouncer"):
        r = caps.get(p + "_run")
        if r is None:
            print(f"  {p:10s} not measured")
            continue
        b = r["bench"]
        cpu = b.get("pooler_cpu_us", 0)
        n = r.get("completed_on_time", 0) or 1
        lat = r.get("latency_seconds", {})
        print(f"  {p:10s} C = {caps[p]:.0f} logins/s  p50 {ms(lat.get('p50'))} ms  p99 {ms(lat.get('p99'))} ms"
              f"  pooler CPU {cpu / n:.0f} us/login  throttled periods {b.get('throttled_periods')}")
    print()

    def cell(r, C):
        if r is None:
            return ["(no run)", "", "", "", "", "", ""]
        if "planned" not in r:
            return [f"FAILED exit {r['bench'].get('exit')}", "", "", "", "", "", ""]
        f = r.get("failed") or {}
        lat = r.get("latency_seconds") or {}
        d = r.get("dispatch") or {}
        ontime = r.get("completed_on_time", 0) / dur / C if C else 0.0
        refused = f.get("refused", 0)
        sq = ",".join(f"{k}:{v}" for k, v in sorted((r.get("refused_by_sqlstate") or {}).items()))
        lag = f"{d.get('max_lag_seconds', 0) * 1000:.0f}ms/{d.get('late_dispatches', 0)}"
        if d.get("late_dispatches", 0):
            lag += "!"
        return [f"{ontime:.2f}", f"{refused}" + (f" ({sq})" if sq else ""), str(f.get("connect", 0)),
                str(f.get("timeout", 0)), ms(lat.get("p50")), ms(lat.get("p99")), lag]

    hdr = ["on time/C", "refused", "conn", "tmo", "p50 ms", "p99 ms", "lag/late"]
    head = ["backlog", "offered"] + [f"pgt {h}" for h in hdr] + [f"pgb {h}" for h in hdr]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in sorted(order, key=lambda k: (k[0], float(k[1]))):
        backlog, mult = key
        row = [str(backlog), f"{mult} C"]
        for p in ("pgtender", "pgbouncer"):
            r = cells.get((p, key))
            row += cell(r, caps.get(p, 0))
        print("| " + " | ".join(row) + " |")
    print()
    print("skipped (generator bound) and other failure classes, per run:")
    for key in sorted(order, key=lambda k: (k[0], float(k[1]))):
        for p in ("pgtender", "pgbouncer"):
            r = cells.get((p, key))
            if r and r.get("failed"):
                other = {k: v for k, v in r["failed"].items() if k not in ("refused", "connect", "timeout") and v}
                if other:
                    print(f"  {p} backlog {key[0]} {key[1]} C: {other}")
            if r and r.get("reconciliation"):
                bad = [x["name"] for x in r["reconciliation"] if not x.get("match")]
                if bad:
                    print(f"  {p} backlog {key[0]} {key[1]} C: reconciliation MISMATCH {bad}")


if __name__ == "__main__":
    main()
