#!/usr/bin/env python3
"""Report of a `make bench` run (deploy/bench/bench.sh): bench-report.py OUTDIR
(or bench-report.py --line FILE: one loginstorm JSON summary as one line).

Reads OUTDIR/measurements.tsv (one line per measurement, as bench.sh recorded
it), the loginstorm JSON or pgbench output each line names, conditions.txt and
cfg/, and writes:
  report.json  every measurement with its raw figures (loginstorm's whole JSON
               summary; pgbench's tps, latency, failed and aborted counts and
               its output), the medians the tables show with every round's
               value, the conditions and the configs;
  report.md    the tables: pgtender, PgBouncer and direct side by side with
               their ratios, medians of the rounds, each round's value in the
               "per round" column (a failed round as "failed"), and a list of
               every failed, skipped or erroring trial.

A loginstorm run counts when it printed its JSON summary (exit 0, or 1 when
some logins failed: those are its "errors"); a pgbench cell when it exited 0
and printed tps. Medians are over the rounds that count; "2 of 3" says a
round failed. Pooler CPU is the pooler process's utime+stime over the run
divided by the logins completed (on time and late) or the transactions done.
Standard library only.
"""
import csv
import json
import os
import re
import statistics
import sys

TARGETS = ("pgtender", "pgbouncer", "direct")
NAMES = {"pgtender": "pgtender", "pgbouncer": "PgBouncer", "direct": "direct", "ceiling": "ceiling",
         "rotation": "pgtender (allow_change)"}
STORM_KINDS = ("calib", "login", "sweep", "rotation", "idle", "pinned_login")


def num(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def read_text(path, limit=200_000):
    try:
        with open(path, errors="replace") as f:
            return f.read(limit)
    except OSError:
        return None


def parse_storm(m):
    """Adds loginstorm's summary and the figures derived from it to m."""
    text = read_text(m["file"]) if m["file"] else None
    try:
        js = json.loads(text) if text else None
    except ValueError:
        js = None
    if not isinstance(js, dict) or "planned" not in js:
        m["status"] = "failed"
        stderr = (read_text(m["file"] + ".stderr") or "").strip().splitlines() if m["file"] else []
        m["reason"] = m["note"] or (stderr[-1][:200] if stderr else f"no JSON summary (exit {m['exit']})")
        return
    m["loginstorm"] = js
    m["status"] = "ok"
    completed = js.get("completed_on_time", 0) + js.get("late", 0)
    lat = js.get("latency_seconds") or {}
    m["logins_per_s"] = js.get("completed_per_second")
    m["errors"] = sum((js.get("failed") or {}).values())
    m["p50_ms"], m["p99_ms"], m["max_ms"] = (lat.get(k, 0) * 1000 for k in ("p50", "p99", "max"))
    cpu = num(m["cpu_us"])
    m["cpu_us_per_login"] = cpu / completed if cpu is not None and completed else None
    rec = js.get("reconciliation")
    if rec:
        m["reconciled"] = all(r.get("match") for r in rec)
    if m["kind"] == "idle":
        held = (js.get("held") or {}).get("opened", 0)
        m["held"] = held
        before, after = num(m["rss_before_kib"]), num(m["rss_held_kib"])
        m["kib_per_client"] = (after - before) / held if held and before is not None and after is not None else None
        if not held:
            m["status"], m["reason"] = "failed", "no connection held"


def parse_pgbench(m):
    """Adds pgbench's figures to m."""
    text = read_text(m["file"]) if m["file"] else None
    m["output"] = text
    if text is None:
        m["status"], m["reason"] = "failed", m["note"] or "no output"
        return

    def grab(pattern):
        found = re.search(pattern, text, re.M)
        return num(found.group(1)) if found else None

    m["tps"] = grab(r"^tps = ([0-9.]+)")
    m["latency_ms"] = grab(r"^latency average = ([0-9.]+) ms")
    m["failed_tx"] = grab(r"^number of failed transactions: ([0-9]+)")
    m["xacts"] = grab(r"^number of transactions actually processed: ([0-9]+)")
    m["aborted_clients"] = len(re.findall(r"client [0-9]+ script [0-9]+ aborted", text))
    cpu = num(m["cpu_us"])
    m["cpu_us_per_tx"] = cpu / m["xacts"] if cpu is not None and m["xacts"] else None
    if m["exit"] == "0" and m["tps"] is not None:
        m["status"] = "ok"
    else:
        m["status"] = "failed"
        first = re.search(r"^.*(error|FATAL|timeout|aborted).*$", text, re.M | re.I)
        m["reason"] = f"exit {m['exit']}, {m['aborted_clients']} clients aborted" + (f": {first.group(0)[:160]}" if first else "")


def load(outdir):
    with open(os.path.join(outdir, "measurements.tsv")) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    for m in rows:
        if m["file"] == "-":
            m["file"] = ""
        if m["exit"] == "-":
            m["status"] = "skipped" if m["note"].startswith("skipped") else "failed"
            m["reason"] = m["note"]
        elif m["kind"] in STORM_KINDS:
            parse_storm(m)
        else:
            parse_pgbench(m)
    return rows


class Report:
    def __init__(self, rows):
        self.rows = rows
        self.summary = {}
        self.lines = []

    def out(self, line=""):
        self.lines.append(line)

    def table(self, head, body):
        self.out("| " + " | ".join(head) + " |")
        self.out("|" + "---|" * len(head))
        for row in body:
            self.out("| " + " | ".join(row) + " |")
        self.out()

    def trials(self, kind, target, param=None):
        return [m for m in self.rows if m["kind"] == kind and m["target"] == target
                and (param is None or m["param"] == str(param))]

    def stat(self, kind, target, param, key):
        """Median of key over the rounds that count, every round's value,
        and how many rounds there were; kept in the JSON summary."""
        trials = self.trials(kind, target, param)
        per_round = [m.get(key) if m["status"] == "ok" else m["status"] for m in trials]
        values = [v for v in per_round if isinstance(v, (int, float))]
        s = {"median": statistics.median(values) if values else None, "rounds": per_round,
             "of": len(trials), "counted": len(values)}
        self.summary.setdefault(kind, {}).setdefault(str(param), {}).setdefault(target, {})[key] = s
        return s


def fmt(value, digits=0):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:,.{digits}f}"


def cell(s, digits=0):
    """A median with "k of n" when some rounds failed; "failed"/"skipped"
    when none counted; "-" when there was no trial."""
    if not s["of"]:
        return "-"
    if not s["counted"]:
        # No figure: a failed or skipped round, or one the figure does not
        # apply to (direct Postgres has no pooler CPU).
        return next((v for v in s["rounds"] if isinstance(v, str)), "-")
    text = fmt(s["median"], digits)
    return text if s["counted"] == s["of"] else f"{text} ({s['counted']} of {s['of']})"


def rounds(s, digits=0):
    return " / ".join(fmt(v, digits) for v in s["rounds"]) if s["of"] and any(v is not None for v in s["rounds"]) else "-"


def ratio(a, b, digits=2):
    if a["median"] is None or not b["median"]:
        return "-"
    return f"{a['median'] / b['median']:.{digits}f}"


def total(report, kind, target, param, key):
    return sum(m.get(key) or 0 for m in report.trials(kind, target, param) if m["status"] == "ok")


def login_table(r, kind, targets, title, ceiling_kind, ceiling_target):
    """A login row (closed loop, 64 workers) for targets, with each one's
    share of the ceiling."""
    r.out(title)
    r.out()
    param = "64"
    ceil = r.stat(ceiling_kind, ceiling_target, param, "logins_per_s")
    figures = [("logins/s", "logins_per_s", 0), ("pooler CPU µs per login", "cpu_us_per_login", 1),
               ("p50 ms", "p50_ms", 2), ("p99 ms", "p99_ms", 1), ("max ms", "max_ms", 1)]
    head = ["figure"] + [NAMES[t] for t in targets] + ["pgtender / PgBouncer"] + \
           [f"per round: {' ; '.join(NAMES[t] for t in targets)}"]
    body = []
    for label, key, digits in figures:
        stats = [r.stat(kind, t, param, key) for t in targets]
        body.append([label] + [cell(s, digits) for s in stats] + [ratio(stats[0], stats[1])] +
                    [" ; ".join(rounds(s, digits) for s in stats)])
    body.append(["errors (all rounds)"] + [fmt(total(r, kind, t, param, "errors")) for t in targets] + ["", ""])
    shares = []
    for t in targets:
        s = r.stat(kind, t, param, "logins_per_s")
        shares.append(ratio(s, ceil) if t != ceiling_target else "1.00")
    body.append([f"share of the ceiling ({fmt(ceil['median'])} logins/s)"] + shares + ["", ""])
    if kind == "login":
        rec = [m.get("reconciled") for m in r.trials(kind, "pgtender", param) if m["status"] == "ok"]
        if rec:
            body.append(["pgtender /metrics reconciliation"] +
                        [f"{sum(1 for x in rec if x)} of {len(rec)} match"] + [""] * (len(targets) + 1))
    r.table(head, body)


def build(r, conditions):
    brief = [l for l in conditions.splitlines() if l.startswith(("commit", "date", "rows:"))]
    r.out("# make bench: pgtender, PgBouncer and direct Postgres in the same run")
    r.out()
    for line in brief:
        r.out(f"    {line}")
    r.out()
    r.out("Medians of the rounds; \"per round\" lists each round's value in the order run (a failed round "
          "as \"failed\"). Ratios are pgtender over PgBouncer (for CPU and latency lower is better). "
          "Pooler CPU = the pooler process's utime+stime over the run / logins completed or transactions done. "
          "The machine is shared: see the load and busiest processes under Conditions.")
    r.out()

    # Calibration.
    r.out("## Calibration: the loopback ceiling (bin/loginceiling, no backend), loginstorm -c 64")
    r.out()
    body = []
    for label in ("before", "after"):
        ms = [m for m in r.rows if m["kind"] == "calib" and m["round"] == label]
        m = ms[0] if ms else None
        if not m:
            body.append([label, "-", "-", "-", "-"])
        elif m["status"] != "ok":
            body.append([label, "failed", "-", "-", m.get("reason", "")])
        else:
            body.append([label, fmt(m["logins_per_s"]), fmt(m["cpu_us_per_login"], 1), fmt(m["p99_ms"], 1), fmt(m["errors"])])
    r.table(["when", "logins/s", "ceiling CPU µs per login", "p99 ms", "errors"], body)

    login_table(r, "login", TARGETS, "## Logins: closed loop, 64 workers, login + SELECT 1 + RST close",
                "calib", "ceiling")

    # Rotation.
    r.out("## Rotation storm: 64 workers, password A then B halfway, ALTER ROLE ... PASSWORD 'B' a quarter of the way in")
    r.out()
    rot = [r.stat("rotation", "rotation", "64", k) for k in ("logins_per_s", "cpu_us_per_login", "p99_ms", "errors")]
    steady = r.stat("login", "pgtender", "64", "logins_per_s")
    sqlstates = {}
    for m in r.trials("rotation", "rotation"):
        for code, n in ((m.get("loginstorm") or {}).get("refused_by_sqlstate") or {}).items():
            sqlstates[code] = sqlstates.get(code, 0) + n
    r.table(["figure", "pgtender (enabled_plain_allow_change)", "per round", "PgBouncer"],
            [["logins/s", cell(rot[0]), rounds(rot[0]),
              "not run: auth_type plain checks its userlist (one password per user), so a client cannot move to a "
              "new password; it changes only by rewriting the file and RELOAD"],
             ["over pgtender's login row (enabled_plain, median)", ratio(rot[0], steady), "", ""],
             ["pooler CPU µs per login", cell(rot[1], 1), rounds(rot[1], 1), ""],
             ["p99 ms", cell(rot[2], 1), rounds(rot[2], 1), ""],
             ["errors", cell(rot[3]), rounds(rot[3]), ""],
             ["refusals by SQLSTATE (all rounds)", ", ".join(f"{k}: {v}" for k, v in sorted(sqlstates.items())) or "none", "", ""],
             ["ALTER ROLE timing; verifications", " / ".join(m["note"] or "-" for m in r.trials("rotation", "rotation")) or "-", "", ""]])

    # Sweep.
    r.out("## Concurrency sweep: closed loop, login + SELECT 1")
    r.out()
    steps = sorted({int(m["param"]) for m in r.rows if m["kind"] == "sweep"})
    peak = {t: max([r.stat("sweep", t, n, "logins_per_s")["median"] or 0 for n in steps] or [0])
            for t in ("pgtender", "pgbouncer")}
    body = []
    for n in steps:
        s = {t: {k: r.stat("sweep", t, n, k) for k in ("logins_per_s", "p99_ms", "max_ms", "errors")}
             for t in ("pgtender", "pgbouncer")}
        of_peak = [fmt(s[t]["logins_per_s"]["median"] / peak[t], 2) if peak[t] and s[t]["logins_per_s"]["median"] else "-"
                   for t in ("pgtender", "pgbouncer")]
        body.append([f"{n:,}", cell(s["pgtender"]["logins_per_s"]), cell(s["pgbouncer"]["logins_per_s"]),
                     ratio(s["pgtender"]["logins_per_s"], s["pgbouncer"]["logins_per_s"])] + of_peak +
                    [cell(s["pgtender"]["p99_ms"], 1), cell(s["pgbouncer"]["p99_ms"], 1),
                     cell(s["pgtender"]["max_ms"], 1), cell(s["pgbouncer"]["max_ms"], 1),
                     fmt(total(r, "sweep", "pgtender", n, "errors")), fmt(total(r, "sweep", "pgbouncer", n, "errors")),
                     f"{rounds(s['pgtender']['logins_per_s'])} ; {rounds(s['pgbouncer']['logins_per_s'])}"])
    r.table(["workers", "pgtender logins/s", "PgBouncer logins/s", "ratio", "pgtender of its peak",
             "PgBouncer of its peak", "pgtender p99 ms", "PgBouncer p99 ms", "pgtender max ms", "PgBouncer max ms",
             "pgtender errors", "PgBouncer errors", "per round logins/s: pgtender ; PgBouncer"], body)

    # pgbench.
    r.out("## pgbench: -S (select only) and TPC-B-like, -M simple / extended / prepared")
    r.out()
    params = []
    for m in r.rows:
        if m["kind"] == "pgbench" and m["param"] not in params:
            params.append(m["param"])
    body = []
    for p in params:
        script, clients, mode = p.split(":")
        s = {t: {k: r.stat("pgbench", t, p, k) for k in ("tps", "latency_ms", "cpu_us_per_tx")} for t in TARGETS}
        failed_tx = " / ".join(fmt(total(r, "pgbench", t, p, "failed_tx")) for t in TARGETS)
        failed_rounds = " / ".join(str(sum(1 for m in r.trials("pgbench", t, p) if m["status"] == "failed")) for t in TARGETS)
        body.append(["-S" if script == "S" else "TPC-B", clients, mode] +
                    [cell(s[t]["tps"]) for t in TARGETS] +
                    [ratio(s["pgtender"]["tps"], s["pgbouncer"]["tps"]), ratio(s["pgtender"]["tps"], s["direct"]["tps"]),
                     ratio(s["pgbouncer"]["tps"], s["direct"]["tps"])] +
                    [" / ".join(cell(s[t]["latency_ms"], 3) for t in TARGETS),
                     " / ".join(cell(s[t]["cpu_us_per_tx"], 1) for t in ("pgtender", "pgbouncer")),
                     failed_tx, failed_rounds,
                     " ; ".join(rounds(s[t]["tps"]) for t in TARGETS)])
    r.table(["script", "-c", "-M", "pgtender tps", "PgBouncer tps", "direct tps", "pgtender / PgBouncer",
             "pgtender / direct", "PgBouncer / direct", "latency ms: pgtender / PgBouncer / direct",
             "pooler CPU µs per tx: pgtender / PgBouncer", "failed tx: pgtender / PgBouncer / direct",
             "rounds failed: pgtender / PgBouncer / direct", "per round tps: pgtender ; PgBouncer ; direct"], body)

    r.out("### Added latency at one client: pgbench -S -c 1, pooler minus direct (median latencies)")
    r.out()
    body = []
    for p in params:
        script, clients, mode = p.split(":")
        if script != "S" or clients != "1":
            continue
        lat = {t: r.stat("pgbench", t, p, "latency_ms")["median"] for t in TARGETS}
        added = {t: (lat[t] - lat["direct"]) if lat[t] is not None and lat["direct"] is not None else None
                 for t in ("pgtender", "pgbouncer")}
        body.append([mode, fmt(lat["direct"], 3), fmt(added["pgtender"], 3), fmt(added["pgbouncer"], 3),
                     fmt(added["pgtender"] / added["pgbouncer"], 2)
                     if added["pgtender"] is not None and added["pgbouncer"] else "-"])
    r.table(["-M", "direct ms", "pgtender + ms", "PgBouncer + ms", "pgtender / PgBouncer"], body)

    # Idle.
    r.out("## Idle clients: RSS growth per idle, logged-in client (loginstorm -hold)")
    r.out()
    body = []
    for n in sorted({m["param"] for m in r.rows if m["kind"] == "idle"}, key=int):
        s = {t: r.stat("idle", t, n, "kib_per_client") for t in ("pgtender", "pgbouncer")}
        desc = []
        for t in ("pgtender", "pgbouncer"):
            desc.append(" / ".join(
                f"{fmt(num(m['rss_before_kib']) / 1024, 1)}→{fmt(num(m['rss_held_kib']) / 1024, 1)} ({m.get('held', 0):,} held)"
                if m["status"] == "ok" else m["status"] for m in r.trials("idle", t, n)) or "-")
        body.append([f"{int(n):,}", cell(s["pgtender"], 2), cell(s["pgbouncer"], 2), ratio(s["pgtender"], s["pgbouncer"])] +
                    desc + [f"{rounds(s['pgtender'], 2)} ; {rounds(s['pgbouncer'], 2)}"])
    r.table(["clients", "pgtender KiB per client", "PgBouncer KiB per client", "pgtender / PgBouncer",
             "pgtender RSS MiB before→held", "PgBouncer RSS MiB before→held", "per round KiB: pgtender ; PgBouncer"], body)

    # Pinned.
    if any(m["kind"].startswith("pinned") for m in r.rows):
        login_table(r, "pinned_login", ("pgtender", "pgbouncer", "ceiling"),
                    "## One core each: pooler on CPU 0 (pgtender GOMAXPROCS=1, workers = 1), loginstorm, pgbench "
                    "and Postgres on CPU 1; the ceiling pinned alike", "pinned_login", "ceiling")
        p = "S:32:simple"
        s = {t: {k: r.stat("pinned_pgbench", t, p, k) for k in ("tps", "latency_ms", "cpu_us_per_tx")}
             for t in ("pgtender", "pgbouncer")}
        r.table(["pgbench -S -c 32 -M simple, pinned", "pgtender", "PgBouncer", "pgtender / PgBouncer",
                 "per round: pgtender ; PgBouncer"],
                [[label, cell(s["pgtender"][k], d), cell(s["pgbouncer"][k], d), ratio(s["pgtender"][k], s["pgbouncer"][k]),
                  f"{rounds(s['pgtender'][k], d)} ; {rounds(s['pgbouncer'][k], d)}"]
                 for label, k, d in (("tps", "tps", 0), ("latency ms", "latency_ms", 3),
                                     ("pooler CPU µs per tx", "cpu_us_per_tx", 1))])

    # Failed trials.
    r.out("## Failed, skipped and erroring trials")
    r.out()
    body = []
    for m in r.rows:
        if m["status"] != "ok":
            body.append([m["kind"], m["round"], NAMES.get(m["target"], m["target"]), m["param"], m["status"],
                         m.get("reason", "").replace("|", "\\|")])
        elif m.get("errors"):
            js = m["loginstorm"]
            classes = ", ".join(f"{k} {v}" for k, v in (js.get("failed") or {}).items() if v)
            examples = "; ".join(v for v in (js.get("examples") or {}).values())[:200]
            body.append([m["kind"], m["round"], NAMES.get(m["target"], m["target"]), m["param"],
                         f"{m['errors']} of {js.get('planned')} logins failed", f"{classes}: {examples}".replace("|", "\\|")])
        elif m.get("reconciled") is False:
            body.append([m["kind"], m["round"], NAMES.get(m["target"], m["target"]), m["param"], "reconciliation mismatch",
                         ", ".join(x["name"] for x in m["loginstorm"]["reconciliation"] if not x.get("match"))])
    if body:
        r.table(["row", "round", "target", "param", "status", "what"], body)
    else:
        r.out("None.")
        r.out()

    loads = [num(m["load1"]) for m in r.rows if num(m["load1"]) is not None]
    if loads:
        r.out(f"1-minute load average at the measurements' starts: {min(loads):.2f} to {max(loads):.2f} "
              f"(median {statistics.median(loads):.2f}) over {len(loads)} measurements.")
        r.out()
    r.out("## Conditions")
    r.out()
    r.out("```")
    r.out(conditions.rstrip())
    r.out("```")


def main():
    if sys.argv[1] == "--line":
        # One loginstorm JSON file's figures, for bench.sh's progress lines.
        m = {"kind": "login", "file": sys.argv[2], "cpu_us": "-", "exit": "?", "note": ""}
        parse_storm(m)
        print(m["reason"] if m["status"] != "ok" else
              f"{m['logins_per_s']:.0f} logins/s, p99 {m['p99_ms']:.1f} ms, {m['errors']} failed")
        return
    outdir = sys.argv[1]
    rows = load(outdir)
    conditions = read_text(os.path.join(outdir, "conditions.txt")) or ""
    configs = {}
    for root, _, files in os.walk(os.path.join(outdir, "cfg")):
        for name in sorted(files):
            path = os.path.join(root, name)
            configs[os.path.relpath(path, outdir)] = read_text(path)
    r = Report(rows)
    build(r, conditions)
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write("\n".join(r.lines) + "\n")
    with open(os.path.join(outdir, "report.json"), "w") as f:
        json.dump({"conditions": conditions, "configs": configs, "summary": r.summary, "measurements": rows},
                  f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
