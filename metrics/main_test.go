package metrics

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/pgtender/pgtender/pooler"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// HTTP server a test starts is shut down, and every client closes its
// connections.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every poll for a condition; a passing test never
// waits for it.
const waitTimeout = 10 * time.Second

// scrape serves gatherer through promhttp, as /metrics does, and returns
// the text exposition.
func scrape(t *testing.T, gatherer prometheus.Gatherer) string {
	t.Helper()
	handler := NewMetricsHandler(gatherer, func() (bool, string) { return true, "" }, nil)
	recorder := httptest.NewRecorder()
	handler.ServeHTTP(recorder, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if recorder.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", recorder.Code, recorder.Body)
	}
	return recorder.Body.String()
}

// parseExposition parses a text exposition back into metric families.
func parseExposition(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the exposition does not parse: %v\n%s", err, text)
	}
	return families
}

func scrapeFamilies(t *testing.T, gatherer prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	return parseExposition(t, scrape(t, gatherer))
}

// labels is a set of label name=value pairs, written "name", "value", ...
func labels(pairs ...string) map[string]string {
	m := make(map[string]string, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		m[pairs[i]] = pairs[i+1]
	}
	return m
}

// find returns the metric of family name whose labels are exactly want,
// or nil.
func find(families map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	family := families[name]
	if family == nil {
		return nil
	}
next:
	for _, m := range family.GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		for _, pair := range m.GetLabel() {
			if v, ok := want[pair.GetName()]; !ok || v != pair.GetValue() {
				continue next
			}
		}
		return m
	}
	return nil
}

// value returns the value of a counter, gauge or untyped sample, failing
// the test when it is missing.
func value(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	m := find(families, name, want)
	if m == nil {
		t.Fatalf("no sample %s%v in the scrape", name, want)
	}
	switch families[name].GetType() {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_UNTYPED:
		return m.GetUntyped().GetValue()
	}
	t.Fatalf("%s is a %s, not a single value", name, families[name].GetType())
	return 0
}

func typeOf(t *testing.T, families map[string]*dto.MetricFamily, name string) dto.MetricType {
	t.Helper()
	family := families[name]
	if family == nil {
		t.Fatalf("no family %s in the scrape", name)
	}
	return family.GetType()
}

// get fetches url with a client that keeps no connection open.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: waitTimeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := io.Copy(&body, resp.Body); err != nil {
		t.Fatalf("GET %s: reading the body: %v", url, err)
	}
	return resp.StatusCode, body.String()
}

// listenWithBacklog opens a listening socket on 127.0.0.1 with the given
// listen(2) backlog, as the pooler's workers do, and returns it with the
// pooler.ListenSocket the collector reads.
func listenWithBacklog(t *testing.T, backlog int) (*net.TCPListener, pooler.ListenSocket) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	listener := l.(*net.TCPListener)
	raw, err := listener.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var listenErr error
	if err := raw.Control(func(fd uintptr) { listenErr = unix.Listen(int(fd), backlog) }); err != nil {
		t.Fatal(err)
	}
	if listenErr != nil {
		t.Fatalf("listen(2) with backlog %d: %v", backlog, listenErr)
	}
	return listener, pooler.ListenSocket{Worker: 0, Addr: listener.Addr(), Conn: raw}
}
