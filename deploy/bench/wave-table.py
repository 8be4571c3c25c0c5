#!/usr/bin/env python3
"""Side-by-side table of a bench-wave run: wave-table.py RUNS.jsonl DURATION_SECONDS.

Every run line is used (failed trials included). C of a peer is the on-time
logins/s of its closed-loop run. "on time/C" = completed_on_time / duration / C.
"refused" = ErrorResponses during login (SQLSTATE counts); "refusal p50/p99 ms"
= their latency from the start of the connect to the ErrorResponse, and
"refused <=100ms" the share of refusals that arrived within 100 ms (loginstorm
reports them since it times refusals; "-" for runs without); "<=100ms of conn"
the share that arrived within 100 ms of the established connection, leaving out
SYN retries while the pooler's accept queue was full (loginstorm reports it
since it times refusals from the connect too). "conn" = TCP
connects refused/reset/timed out; "tmo" = timeouts at the 5 s deadline; "lag" =
the generator's max dispatch lag and the number of dispatches more than 10 ms
late.

Repeated trials: bench-wave.sh writes one line per trial for each (peer,
backlog, offered) cell and one closed-loop "C" line per peer and trial, marked
bench.trial = 1, 2, 3... (lines without it are numbered in file order). A
trial's on time/C is taken against that same trial's C (the median C when the
trial has none), and the table shows the median over the trials, with every
trial's on time/C listed in "trials" so that failed trials stay visible. The
other figures are medians over the trials that produced a summary; lag is the
worst trial's. With one trial per cell the table has no "trials" column.
"""
import json
import statistics
import sys

PEERS = ("pgtender", "pgbouncer")


def ms(x):
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def count(x):
    return "-" if x is None else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def main():
    path, dur = sys.argv[1], float(sys.argv[2])
    runs = [json.loads(l) for l in open(path) if l.strip()]
    # caps[peer] and cells[(peer, key)] are lists of (trial, run) in file
    # order; trial is None for lines without bench.trial.
    caps, cells, order = {}, {}, []
    for r in runs:
        b = r.get("bench", {})
        peer = b.get("peer")
        if b.get("mult") == "C":
            trials = caps.setdefault(peer, [])
        else:
            key = (b.get("backlog"), b.get("mult"))
            if key not in order:
                order.append(key)
            trials = cells.setdefault((peer, key), [])
        trials.append((b.get("trial"), r))
    repeated = any(len(t) > 1 for t in list(caps.values()) + list(cells.values()))

    def c_of(r):
        return r.get("ontime_per_second", 0.0) if "planned" in r else None

    median_c = {p: median(c_of(r) for _, r in caps.get(p, [])) or 0.0 for p in PEERS}
    c_by_trial = {p: {t: c_of(r) for t, r in caps.get(p, []) if t is not None} for p in PEERS}

    print("capacity C (closed loop, 64 workers):")
    for p in PEERS:
        trials = [(t, r) for t, r in caps.get(p, []) if "planned" in r]
        if not trials:
            failed = caps.get(p)
            print(f"  {p:10s} " + (f"C run FAILED exit {failed[-1][1]['bench'].get('exit')}" if failed else "not measured"))
            continue
        runs_ = [r for _, r in trials]
        cpu = median(r["bench"].get("pooler_cpu_us", 0) / (r.get("completed_on_time", 0) or 1) for r in runs_)
        p50 = median((r.get("latency_seconds") or {}).get("p50") for r in runs_)
        p99 = median((r.get("latency_seconds") or {}).get("p99") for r in runs_)
        throttled = " ".join(str(r["bench"].get("throttled_periods")) for r in runs_)
        line = f"  {p:10s} C = {median_c[p]:.0f} logins/s"
        if len(caps[p]) > 1:
            line += " (trials " + " ".join("FAILED" if c_of(r) is None else f"{c_of(r):.0f}" for _, r in caps[p]) + ")"
        print(line + f"  p50 {ms(p50)} ms  p99 {ms(p99)} ms  pooler CPU {cpu:.0f} us/login  throttled periods {throttled}")
    print()

    def ontime(p, trial, r):
        """A trial's on time/C, against its own C when it has one."""
        C = c_by_trial[p].get(trial) or median_c[p]
        return r.get("completed_on_time", 0) / dur / C if C else 0.0

    def refusal_latency(r):
        lat = r.get("refusal_latency_seconds")
        if not lat or not lat.get("count"):
            return None, None, None, None
        of_conn = r.get("refusals_within_100ms_of_connect")
        return (lat.get("p50"), lat.get("p99"), r.get("refusals_within_100ms", 0) / lat["count"],
                None if of_conn is None else of_conn / lat["count"])

    def cell(p, trials):
        n = len(hdr) + (1 if repeated else 0)
        if not trials:
            return ["(no run)"] + [""] * (n - 1)
        ok = [(t, r) for t, r in trials if "planned" in r]
        spread = [f"FAIL({r['bench'].get('exit')})" if "planned" not in r else f"{ontime(p, t, r):.2f}" for t, r in trials]
        if not ok:
            return [f"FAILED exit {trials[-1][1]['bench'].get('exit')}"] + [""] * (n - 2) + ([" ".join(spread)] if repeated else [""])
        runs_ = [r for _, r in ok]
        failed = [r.get("failed") or {} for r in runs_]
        lat = [r.get("latency_seconds") or {} for r in runs_]
        disp = [r.get("dispatch") or {} for r in runs_]
        sqlstates = sorted({k for r in runs_ for k in (r.get("refused_by_sqlstate") or {})})
        by_sqlstate = {k: median((r.get("refused_by_sqlstate") or {}).get(k, 0) for r in runs_) for k in sqlstates}
        sq = ",".join(f"{k}:{count(v)}" for k, v in by_sqlstate.items() if v)
        refused = count(median(f.get("refused", 0) for f in failed))
        refusals = [refusal_latency(r) for r in runs_]
        ref_p50, ref_p99, ref_fast, ref_fast_conn = (median(x[i] for x in refusals) for i in range(4))
        ref_lat = "-" if ref_p50 is None else f"{ms(ref_p50)}/{ms(ref_p99)}"
        worst = max(disp, key=lambda d: (d.get("max_lag_seconds", 0), d.get("late_dispatches", 0)))
        lag = f"{worst.get('max_lag_seconds', 0) * 1000:.0f}ms/{worst.get('late_dispatches', 0)}"
        if any(d.get("late_dispatches", 0) for d in disp):
            lag += "!"
        row = [f"{median(ontime(p, t, r) for t, r in ok):.2f}", refused + (f" ({sq})" if sq else ""),
               count(median(f.get("connect", 0) for f in failed)), count(median(f.get("timeout", 0) for f in failed)),
               ms(median(x.get("p50") for x in lat)), ms(median(x.get("p99") for x in lat)),
               ref_lat, "-" if ref_fast is None else f"{ref_fast * 100:.0f}%",
               "-" if ref_fast_conn is None else f"{ref_fast_conn * 100:.0f}%", lag]
        return row + ([" ".join(spread)] if repeated else [])

    hdr = ["on time/C", "refused", "conn", "tmo", "p50 ms", "p99 ms", "refusal p50/p99 ms", "refused <=100ms", "<=100ms of conn", "lag/late"]
    cols = hdr + (["trials"] if repeated else [])
    head = ["backlog", "offered"] + [f"pgt {h}" for h in cols] + [f"pgb {h}" for h in cols]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for key in sorted(order, key=lambda k: (k[0], float(k[1]))):
        backlog, mult = key
        row = [str(backlog), f"{mult} C"]
        for p in PEERS:
            row += cell(p, cells.get((p, key), []))
        print("| " + " | ".join(row) + " |")
    print()
    print("skipped (generator bound) and other failure classes, per run:")
    for key in sorted(order, key=lambda k: (k[0], float(k[1]))):
        for p in PEERS:
            for t, r in cells.get((p, key), []):
                label = f"{p} backlog {key[0]} {key[1]} C" + (f" trial {t}" if repeated and t is not None else "")
                if r.get("failed"):
                    other = {k: v for k, v in r["failed"].items() if k not in ("refused", "connect", "timeout") and v}
                    if other:
                        print(f"  {label}: {other}")
                if r.get("reconciliation"):
                    bad = [x["name"] for x in r["reconciliation"] if not x.get("match")]
                    if bad:
                        print(f"  {label}: reconciliation MISMATCH {bad}")


if __name__ == "__main__":
    main()
