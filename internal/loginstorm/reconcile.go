package loginstorm

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
// one of pgtender's counters over the run.
type ReconcileRow struct {
	Name      string  `json:"name"`
	Generator int64   `json:"generator"`
	Server    float64 `json:"server_delta"`
	Match     bool    `json:"match"`
	Note      string  `json:"note,omitempty"`
}

// Reconcile compares the summary with the counters' change from before to
// after. held is the number of -hold connections opened (each is one
// admitted login on the server).
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
	var rows []ReconcileRow

	readyAbandons := summary.AbandonedStage[StageReady]
	ok := ReconcileRow{Name: `logins_total{result="ok"}`, Generator: summary.LoggedIn + held, Server: delta(results, "ok")}
	ok.Match = ok.Server >= float64(ok.Generator) && ok.Server <= float64(ok.Generator+readyAbandons)
	if readyAbandons > 0 {
		ok.Note = fmt.Sprintf("up to %d logins abandoned at ready may count as ok: the server may write ReadyForQuery before it sees the close", readyAbandons)
	} else {
		ok.Match = ok.Server == float64(ok.Generator)
	}
	rows = append(rows, ok)

	var authRefusals, otherRefusals int64
	for sqlState, count := range summary.RefusedBySQL {
		if strings.HasPrefix(sqlState, "28") {
			authRefusals += count
		} else {
			otherRefusals += count
		}
	}
	authFailed := ReconcileRow{Name: `logins_total{result="auth_failed"}`, Generator: authRefusals, Server: delta(results, "auth_failed"), Note: "refusals with SQLSTATE class 28"}
	authFailed.Match = authFailed.Server == float64(authFailed.Generator)
	rows = append(rows, authFailed)
	shed := ReconcileRow{Name: `logins_total{result=~"shed|rejected|error"}`, Generator: otherRefusals, Server: delta(results, "shed", "rejected", "error"),
		Note: fmt.Sprintf("other refusals; 53300 seen: %d, server shed: %.0f", summary.RefusedBySQL["53300"], delta(results, "shed"))}
	shed.Match = shed.Server == float64(shed.Generator)
	rows = append(rows, shed)

	for _, stage := range []Stage{StageStartup, StageAuth, StageReady} {
		generator := summary.AbandonedStage[stage] + summary.TimeoutStage[stage]
		row := ReconcileRow{Name: fmt.Sprintf(`logins_abandoned_total{stage=%q}`, stage), Generator: generator, Server: delta(abandonedStages, string(stage))}
		row.Match = row.Server == float64(generator)
		if stage == StageReady && summary.AbandonedStage[stage] > 0 {
			row.Match = row.Server <= float64(generator)
			row.Note = "may be fewer: see the ok row"
		}
		if timeouts := summary.TimeoutStage[stage]; timeouts > 0 {
			row.Note = strings.TrimPrefix(row.Note+fmt.Sprintf("; includes %d client timeouts, which the server may place in another stage", timeouts), "; ")
		}
		rows = append(rows, row)
	}

	// Every login that reached the server ends in exactly one of these
	// counters, whatever the stage accounting: the robust total.
	reached := summary.Planned - summary.Failed[ClassSkipped] - summary.Failed[ClassConnect] + held
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
	total := ReconcileRow{Name: "all logins ended (results + abandoned)", Generator: reached, Server: serverTotal,
		Note: "planned - skipped - connect failures + held; a timeout still in progress on the server at the second scrape shows as a shortfall"}
	total.Match = total.Server == float64(total.Generator)
	rows = append(rows, total)
	return rows
}

func writeReconciliation(out io.Writer, rows []ReconcileRow) {
	fmt.Fprintln(out, "  reconciliation with /metrics (change over the run):")
	fmt.Fprintf(out, "    %-44s %10s %12s  %s\n", "counter", "generator", "server", "")
	for _, row := range rows {
		verdict := "ok"
		if !row.Match {
			verdict = "MISMATCH"
		}
		fmt.Fprintf(out, "    %-44s %10d %12.0f  %s", row.Name, row.Generator, row.Server, verdict)
		if row.Note != "" {
			fmt.Fprintf(out, "  (%s)", row.Note)
		}
		fmt.Fprintln(out)
	}
}
