package loginstorm

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// LoginCounters are pgtender's login counters at one scrape.
type LoginCounters struct {
	Results   map[string]float64 // logins_total by result
	Abandoned map[string]float64 // logins_abandoned_total by stage
	// InFlight is the logins_in_flight gauge; HasInFlight is false when the
	// server does not export it.
	InFlight    float64
	HasInFlight bool
	// Unsettled is set by the scraper when the server was still ending
	// logins (in flight, or counters moving) when it stopped waiting.
	Unsettled bool
}

// ScrapeLoginCounters fetches url (pgtender's /metrics, text exposition)
// and reads <namespace>logins_total and <namespace>logins_abandoned_total.
func ScrapeLoginCounters(ctx context.Context, client *http.Client, url, namespace string) (LoginCounters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return LoginCounters{}, err
	}
	request.Header.Set("Accept", "text/plain; version=0.0.4")
	response, err := client.Do(request)
	if err != nil {
		return LoginCounters{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		return LoginCounters{}, fmt.Errorf("scrape %s: HTTP %s", url, response.Status)
	}
	return ParseLoginCounters(io.LimitReader(response.Body, 64<<20), namespace)
}

// ParseLoginCounters reads the login counters from a text exposition.
func ParseLoginCounters(exposition io.Reader, namespace string) (LoginCounters, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(exposition)
	if err != nil {
		return LoginCounters{}, fmt.Errorf("parse metrics: %w", err)
	}
	logins, found := families[namespace+"logins_total"]
	if !found {
		return LoginCounters{}, fmt.Errorf("metric %slogins_total not found (is -metrics-namespace right?)", namespace)
	}
	counters := LoginCounters{Results: byLabel(logins, "result"), Abandoned: map[string]float64{}}
	if abandoned, found := families[namespace+"logins_abandoned_total"]; found {
		counters.Abandoned = byLabel(abandoned, "stage")
	}
	if inFlight, found := families[namespace+"logins_in_flight"]; found {
		for _, metric := range inFlight.GetMetric() {
			counters.InFlight += metric.GetGauge().GetValue() + metric.GetUntyped().GetValue()
		}
		counters.HasInFlight = true
	}
	return counters, nil
}

func byLabel(family *dto.MetricFamily, label string) map[string]float64 {
	values := map[string]float64{}
	for _, metric := range family.GetMetric() {
		for _, pair := range metric.GetLabel() {
			if pair.GetName() == label {
				values[pair.GetValue()] += metric.GetCounter().GetValue() + metric.GetUntyped().GetValue()
			}
		}
	}
	return values
}

// ReconcileRow compares one of the generator's counts with the change in
// one of pgtender's counters over the run. The server's change must lie in
// [ServerMin, ServerMax]: a login that ended without the server's answer
// (a timeout, a broken connection) may have been counted in one of several
// counters, or, if the server never heard from it, in none.
type ReconcileRow struct {
	Name      string  `json:"name"`
	Generator int64   `json:"generator"`
	Server    float64 `json:"server_delta"`
	ServerMin int64   `json:"server_min"`
	ServerMax int64   `json:"server_max"`
	Match     bool    `json:"match"`
	Note      string  `json:"note,omitempty"`
}

// destination is where the server may have counted a login: one of its
// counters, or none (unseen).
type destination string

const (
	toOK         destination = "ok"
	toAuthFailed destination = "auth_failed"
	toShed       destination = "shed"
	toOther      destination = "rejected|error"
	toStartup    destination = "abandoned at startup"
	toAuth       destination = "abandoned at auth"
	toReady      destination = "abandoned at ready"
	toUnseen     destination = "unseen"
)

var seenDestinations = []destination{toOK, toAuthFailed, toShed, toOther, toStartup, toAuth, toReady}

// endGroup is a number of logins whose end the generator knows only up to a
// set of server counters they may be in.
type endGroup struct {
	what  string
	count int64
	into  []destination
}

// Reconcile compares the summary with the counters' change from before to
// after. held is the number of -hold connections opened (each is one
// admitted login on the server).
//
// What the client saw settles most logins: ReadyForQuery is an ok login,
// an ErrorResponse read is a refusal of its SQLSTATE's kind. The others
// ended without the server's answer, and the server may have counted them
// in any of the counters the stage they reached allows (endGroups), or not
// at all when it never heard from them. Each row's counter must lie between
// what certainly ended in it plus those of the uncertain logins that fit
// nowhere else (the other counters did not grow enough to hold them), and
// what certainly ended in it plus every uncertain login that may have. Rows
// no uncertain login may be in compare exactly.
func Reconcile(summary Summary, held int64, before, after LoginCounters) []ReconcileRow {
	delta := func(values func(LoginCounters) map[string]float64, keys ...string) float64 {
		var total float64
		for _, key := range keys {
			total += values(after)[key] - values(before)[key]
		}
		return total
	}
	results := func(c LoginCounters) map[string]float64 { return c.Results }
	abandonedStages := func(c LoginCounters) map[string]float64 { return c.Abandoned }
	server := map[destination]float64{
		toOK: delta(results, "ok"), toAuthFailed: delta(results, "auth_failed"), toShed: delta(results, "shed"),
		toOther: delta(results, "rejected", "error"), toStartup: delta(abandonedStages, string(StageStartup)),
		toAuth: delta(abandonedStages, string(StageAuth)), toReady: delta(abandonedStages, string(StageReady)),
	}
	// Every login that reached the server ends in exactly one of these
	// counters, whatever the stage accounting: the robust total.
	var serverTotal float64
	for _, counters := range []map[string]float64{after.Results, after.Abandoned} {
		for key := range counters {
			serverTotal += counters[key]
		}
	}
	for _, counters := range []map[string]float64{before.Results, before.Abandoned} {
		for key := range counters {
			serverTotal -= counters[key]
		}
	}

	var authRefusals, shedRefusals, otherRefusals int64
	for sqlState, count := range summary.RefusedBySQL {
		switch {
		case strings.HasPrefix(sqlState, "28"):
			authRefusals += count
		case sqlState == "53300":
			shedRefusals += count
		default:
			otherRefusals += count
		}
	}
	certain := map[destination]int64{
		toOK: summary.LoggedIn + held, toAuthFailed: authRefusals, toOther: otherRefusals,
		// The client read the password request: the server was waiting for
		// the password when the client left.
		toAuth: summary.AbandonedStage[StageAuth],
	}
	groups := []endGroup{
		// 53300 is admission control's shed, but also max_client_connections
		// or no server connection within checkout_timeout (rejected).
		{"refused with 53300 (shed, or rejected)", shedRefusals, []destination{toShed, toOther}},
		// Four bytes then a close: under overload the server may shed the
		// connection, or see only the close.
		{"abandoned at startup", summary.AbandonedStage[StageStartup], []destination{toStartup, toShed, toUnseen}},
		// The server may have written ReadyForQuery before it saw the close.
		{"abandoned at ready", summary.AbandonedStage[StageReady], []destination{toOK, toReady}},
		{"whose connect timed out", summary.Unanswered[ReachConnect], []destination{toShed, toUnseen}},
		// Still in the accept queue, perhaps: the server never saw them, or
		// found them later (shed them, or saw them leave).
		{"that ended before hearing the server", summary.Unanswered[ReachSent], []destination{toShed, toOther, toStartup, toAuth, toUnseen}},
		{"that ended before sending the password", summary.Unanswered[ReachHeard], []destination{toAuthFailed, toOther, toAuth}},
		// The server may have checked the password and admitted (or
		// refused) the login before it noticed the client had left.
		{"that ended after sending the password", summary.Unanswered[ReachPassword], []destination{toOK, toAuthFailed, toOther, toAuth, toReady}},
		{"that ended after AuthenticationOk", summary.Unanswered[ReachAuthOK], []destination{toOK, toOther, toReady}},
	}
	var unknownReach int64
	for reach, count := range summary.Unanswered {
		if !slices.Contains([]Reach{ReachConnect, ReachSent, ReachHeard, ReachPassword, ReachAuthOK}, reach) {
			unknownReach += count
		}
	}
	var heldFailed int64
	if summary.Held != nil {
		heldFailed = summary.Held.Failed
	}
	anywhere := append(slices.Clone(seenDestinations), toUnseen)
	groups = append(groups,
		endGroup{"that ended at an unknown point", unknownReach, anywhere},
		endGroup{"held connections that failed to open", heldFailed, anywhere})

	// room is how many uncertain logins each counter can hold: its growth
	// beyond its certain logins, but never more than the uncertain logins
	// that may be in it, so that a count nothing explains fails its own row
	// and does not squeeze the others. Unseen's room is what the server's
	// total, so trimmed, lacks.
	var certainTotal, groupTotal, seenMin int64
	for _, count := range certain {
		certainTotal += count
	}
	possible := map[destination]int64{}
	for _, group := range groups {
		groupTotal += group.count
		if !slices.Contains(group.into, toUnseen) {
			seenMin += group.count
		}
		for _, to := range group.into {
			possible[to] += group.count
		}
	}
	room := map[destination]int64{}
	var explained int64
	for _, to := range seenDestinations {
		grown := int64(math.Round(server[to])) - certain[to]
		room[to] = min(max(0, grown), possible[to])
		explained += min(max(0, int64(math.Round(server[to]))), certain[to]+possible[to])
	}
	room[toUnseen] = min(max(0, certainTotal+groupTotal-explained), possible[toUnseen])
	// placeable is how many uncertain logins fit in the counters' room: all
	// of them when the counts are consistent.
	placeable := placeGroups(groups, room, nil)

	bounded := func(name string, generator int64, note string, counters ...destination) ReconcileRow {
		row := ReconcileRow{Name: name, Generator: generator}
		for _, to := range counters {
			row.Server += server[to]
			row.ServerMin += certain[to]
		}
		// A group that may only be in this row's counters is certain here.
		certainHere := row.ServerMin
		row.ServerMax = row.ServerMin
		var may []string
		for _, group := range groups {
			inside := func(to destination) bool { return slices.Contains(counters, to) }
			switch {
			case group.count == 0 || !slices.ContainsFunc(group.into, inside):
			case !slices.ContainsFunc(group.into, func(to destination) bool { return !inside(to) }):
				certainHere += group.count
				row.ServerMax += group.count
			default:
				row.ServerMax += group.count
				may = append(may, fmt.Sprintf("%d %s", group.count, group.what))
			}
		}
		// Whatever of the placeable logins cannot go to the other counters
		// (within their room) must be in this row.
		row.ServerMin = max(certainHere, row.ServerMin+placeable-placeGroups(groups, room, counters))
		row.Match = row.Server >= float64(row.ServerMin) && row.Server <= float64(row.ServerMax)
		switch {
		case len(may) > 0 && row.ServerMin == row.ServerMax:
			note = joinNote(note, strings.Join(may, ", ")+": all here, as the other counters they may be in did not grow")
		case len(may) > 0:
			uncertain := strings.Join(may, ", ") + " may be here"
			if certainHere > 0 {
				uncertain = fmt.Sprintf("besides %d certain, ", certainHere) + uncertain
			}
			if must := row.ServerMin - certainHere; must > 0 {
				uncertain += fmt.Sprintf(", at least %d of them as the other counters they may be in did not grow enough", must)
			}
			note = joinNote(note, uncertain)
		}
		row.Note = note
		return row
	}

	var rows []ReconcileRow
	rows = append(rows, bounded(`logins_total{result="ok"}`, summary.LoggedIn+held, "", toOK))
	rows = append(rows, bounded(`logins_total{result="auth_failed"}`, authRefusals, "refusals with SQLSTATE class 28", toAuthFailed))
	rows = append(rows, bounded(`logins_total{result=~"shed|rejected|error"}`, shedRefusals+otherRefusals,
		fmt.Sprintf("other refusals; 53300 seen: %d, server shed: %.0f", shedRefusals, server[toShed]), toShed, toOther))
	rows = append(rows, bounded(`logins_total{result="shed"}`, shedRefusals, "refusals with 53300", toShed))
	for _, stage := range []struct {
		stage Stage
		to    destination
	}{{StageStartup, toStartup}, {StageAuth, toAuth}, {StageReady, toReady}} {
		note := ""
		if timeouts := summary.TimeoutStage[stage.stage]; timeouts > 0 {
			note = fmt.Sprintf("generator: %d abandoned + %d timed out at this client stage", summary.AbandonedStage[stage.stage], timeouts)
		}
		rows = append(rows, bounded(fmt.Sprintf(`logins_abandoned_total{stage=%q}`, stage.stage),
			summary.AbandonedStage[stage.stage]+summary.TimeoutStage[stage.stage], note, stage.to))
	}

	reached := summary.Planned - summary.Failed[ClassSkipped] - summary.Failed[ClassConnect] + held
	total := ReconcileRow{Name: "all logins ended (results + abandoned)", Generator: reached, Server: serverTotal,
		ServerMin: certainTotal + seenMin, ServerMax: certainTotal + groupTotal}
	total.Match = total.Server >= float64(total.ServerMin) && total.Server <= float64(total.ServerMax)
	total.Note = "planned - skipped - connect failures + held"
	if unseen := total.ServerMax - total.ServerMin; unseen > 0 {
		total.Note += fmt.Sprintf("; up to %d may never have reached the server (or reached it only after the client left)", unseen)
	}
	if before.Unsettled || after.Unsettled {
		total.Note += "; the server was still ending logins at a scrape, so logins of another run may be counted"
	}
	rows = append(rows, total)
	return rows
}

// placeGroups is the most uncertain logins that fit in the counters' room,
// leaving out the counters in excluded: a maximum flow from the groups to
// the counters they may be in, each counter holding at most its room.
func placeGroups(groups []endGroup, room map[destination]int64, excluded []destination) int64 {
	destinations := append(slices.Clone(seenDestinations), toUnseen)
	// Nodes: 0 source, 1..len(groups) groups, then destinations, then sink.
	sink := 1 + len(groups) + len(destinations)
	capacity := make([][]int64, sink+1)
	for node := range capacity {
		capacity[node] = make([]int64, sink+1)
	}
	for g, group := range groups {
		capacity[0][1+g] = group.count
		for d, to := range destinations {
			if slices.Contains(group.into, to) && !slices.Contains(excluded, to) {
				capacity[1+g][1+len(groups)+d] = group.count
			}
		}
	}
	for d, to := range destinations {
		capacity[1+len(groups)+d][sink] = room[to]
	}
	// Edmonds-Karp: the graph has a score of nodes.
	var flow int64
	for {
		parent := make([]int, sink+1)
		for node := range parent {
			parent[node] = -1
		}
		parent[0] = 0
		queue := []int{0}
		for len(queue) > 0 && parent[sink] < 0 {
			node := queue[0]
			queue = queue[1:]
			for next, left := range capacity[node] {
				if left > 0 && parent[next] < 0 {
					parent[next] = node
					queue = append(queue, next)
				}
			}
		}
		if parent[sink] < 0 {
			return flow
		}
		push := int64(math.MaxInt64)
		for node := sink; node != 0; node = parent[node] {
			push = min(push, capacity[parent[node]][node])
		}
		for node := sink; node != 0; node = parent[node] {
			capacity[parent[node]][node] -= push
			capacity[node][parent[node]] += push
		}
		flow += push
	}
}

func joinNote(note, more string) string {
	if note == "" {
		return more
	}
	return note + "; " + more
}

func writeReconciliation(out io.Writer, rows []ReconcileRow) {
	fmt.Fprintln(out, "  reconciliation with /metrics (change over the run):")
	fmt.Fprintf(out, "    %-44s %10s %12s %15s\n", "counter", "generator", "server", "expected")
	for _, row := range rows {
		verdict := "ok"
		if !row.Match {
			verdict = "MISMATCH"
		}
		expected := fmt.Sprint(row.ServerMin)
		if row.ServerMax != row.ServerMin {
			expected = fmt.Sprintf("%d..%d", row.ServerMin, row.ServerMax)
		}
		fmt.Fprintf(out, "    %-44s %10d %12.0f %15s  %s", row.Name, row.Generator, row.Server, expected, verdict)
		if row.Note != "" {
			fmt.Fprintf(out, "  (%s)", row.Note)
		}
		fmt.Fprintln(out)
	}
}

// SumCounts adds up the counts of summaries of runs against one server that
// overlapped in time (several generator processes, for more connections
// than one process may open), so that Reconcile can compare them with the
// server's counters over the whole. Only counts are summed: latencies,
// rates, the gate and the settings of the result are zero.
func SumCounts(summaries ...Summary) Summary {
	total := Summary{
		Failed: map[Class]int64{}, RefusedBySQL: map[string]int64{}, AbandonedStage: map[Stage]int64{},
		TimeoutStage: map[Stage]int64{}, Unanswered: map[Reach]int64{},
	}
	for _, s := range summaries {
		total.Planned += s.Planned
		total.OnTime += s.OnTime
		total.Late += s.Late
		total.Abandoned += s.Abandoned
		total.WrongRefused += s.WrongRefused
		total.LoggedIn += s.LoggedIn
		addCounts(total.Failed, s.Failed)
		addCounts(total.RefusedBySQL, s.RefusedBySQL)
		addCounts(total.AbandonedStage, s.AbandonedStage)
		addCounts(total.TimeoutStage, s.TimeoutStage)
		addCounts(total.Unanswered, s.Unanswered)
		if s.Held != nil {
			if total.Held == nil {
				total.Held = &HoldSummary{}
			}
			total.Held.Wanted += s.Held.Wanted
			total.Held.Opened += s.Held.Opened
			total.Held.Failed += s.Held.Failed
		}
	}
	return total
}

func addCounts[K comparable](into, from map[K]int64) {
	for key, count := range from {
		into[key] += count
	}
}
