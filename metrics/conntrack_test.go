package metrics

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// conntrackHeader is the header line of /proc/net/stat/nf_conntrack as
// current kernels print it (ct_cpu_seq_show, with its double spaces).
const conntrackHeader = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n"

// conntrackRow is one CPU's row of that file with insert_failed, drop and
// early_drop set and every other column a distinct value, so a parser
// that reads the wrong column gets a wrong sum.
func conntrackRow(insertFailed, drop, earlyDrop string) string {
	return "0000002a  00000011 00000012 00000000 00000013 00000000 00000000 00000014 00000015 " +
		insertFailed + " " + drop + " " + earlyDrop + " 00000016  00000000 00000000 00000000 00000017\n"
}

func TestParseConntrackStat(t *testing.T) {
	// The column order of kernels before clashres and chainlength: the
	// columns are found by name.
	const oldHeader = "entries  searched found new invalid ignore delete delete_list insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n"
	for _, c := range []struct {
		name, data string
		want       conntrackCounters
		err        string
	}{
		{"one CPU", conntrackHeader + conntrackRow("00000001", "00000002", "00000003"),
			conntrackCounters{InsertFailed: 1, Drop: 2, EarlyDrop: 3}, ""},
		{"summed over CPUs, hex", conntrackHeader +
			conntrackRow("00000001", "0000000a", "000000ff") +
			conntrackRow("00000002", "00000010", "00000001") +
			conntrackRow("00000000", "00000000", "00000000"),
			conntrackCounters{InsertFailed: 3, Drop: 26, EarlyDrop: 256}, ""},
		{"all zero", conntrackHeader + conntrackRow("00000000", "00000000", "00000000"), conntrackCounters{}, ""},
		{"largest 32-bit values on two CPUs", conntrackHeader +
			conntrackRow("ffffffff", "ffffffff", "ffffffff") + conntrackRow("ffffffff", "ffffffff", "ffffffff"),
			conntrackCounters{InsertFailed: 2 * (1<<32 - 1), Drop: 2 * (1<<32 - 1), EarlyDrop: 2 * (1<<32 - 1)}, ""},
		{"older column names", oldHeader + conntrackRow("00000004", "00000005", "00000006"),
			conntrackCounters{InsertFailed: 4, Drop: 5, EarlyDrop: 6}, ""},
		{"columns in another order", "early_drop x drop insert_failed\n00000001 ffff 00000002 00000003\n",
			conntrackCounters{InsertFailed: 3, Drop: 2, EarlyDrop: 1}, ""},
		{"no trailing newline", strings.TrimSuffix(conntrackHeader+conntrackRow("00000001", "00000002", "00000003"), "\n"),
			conntrackCounters{InsertFailed: 1, Drop: 2, EarlyDrop: 3}, ""},
		{"empty", "", conntrackCounters{}, "no header line"},
		{"header only", conntrackHeader, conntrackCounters{}, "no per-CPU rows"},
		{"no drop column", "entries insert_failed early_drop\n0 0 0\n", conntrackCounters{}, "no drop column"},
		{"no early_drop column", "entries insert_failed drop\n0 0 0\n", conntrackCounters{}, "no early_drop column"},
		{"no insert_failed column", "entries drop early_drop\n0 0 0\n", conntrackCounters{}, "no insert_failed column"},
		{"short row", conntrackHeader + "00000000 00000000\n", conntrackCounters{}, "row 1: 2 values for 17 columns"},
		{"not hex", "drop early_drop insert_failed\n0000000g 0 0\n", conntrackCounters{}, "row 1 drop"},
		{"negative", "drop early_drop insert_failed\n0 -1 0\n", conntrackCounters{}, "row 1 early_drop"},
		{"second row broken", "drop early_drop insert_failed\n1 2 3\n1 2 x\n", conntrackCounters{}, "row 2 insert_failed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseConntrackStat([]byte(c.data))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("parseConntrackStat: error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseConntrackStat: %v", err)
			}
			if got != c.want {
				t.Errorf("parseConntrackStat = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestReadConntrackCounters(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "nf_conntrack")
	if err := os.WriteFile(path, []byte(conntrackHeader+conntrackRow("00000001", "00000002", "00000003")), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := readConntrackCounters(path)
	if err != nil || got != (conntrackCounters{InsertFailed: 1, Drop: 2, EarlyDrop: 3}) {
		t.Errorf("readConntrackCounters = %+v, %v", got, err)
	}
	if _, err := readConntrackCounters(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: error %v, want not-exist", err)
	}
	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("drop\n1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readConntrackCounters(broken); err == nil || !strings.Contains(err.Error(), broken) {
		t.Errorf("a file without early_drop: error %v, want one naming the file", err)
	}
}

// TestReadConntrackCountersProc reads this machine's real file, where it
// has one.
func TestReadConntrackCountersProc(t *testing.T) {
	counters, err := readConntrackCounters(procConntrackStat)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skipf("%s does not exist here (no nf_conntrack in this kernel or namespace): the conntrack metrics are absent", procConntrackStat)
	}
	if err != nil {
		t.Fatalf("reading %s: %v", procConntrackStat, err)
	}
	t.Logf("%s: drop %d, early_drop %d, insert_failed %d", procConntrackStat, counters.Drop, counters.EarlyDrop, counters.InsertFailed)
}

// TestCollectorConntrack checks the collector against fake files: the
// three counters with the namespace's prefix where the file parses, and no
// series at all where it is missing or broken, logged once each however
// many scrapes follow (info for a missing file, warn for a broken one).
func TestCollectorConntrack(t *testing.T) {
	names := []string{"pgtender_conntrack_drops_total", "pgtender_conntrack_early_drops_total", "pgtender_conntrack_insert_failed_total"}
	dir := t.TempDir()

	present := filepath.Join(dir, "nf_conntrack")
	if err := os.WriteFile(present, []byte(conntrackHeader+
		conntrackRow("00000001", "00000002", "00000003")+conntrackRow("00000010", "00000020", "00000030")), 0o600); err != nil {
		t.Fatal(err)
	}
	collector := NewCollector("pgtender_", &fakeSource{}, nil)
	collector.netstatPath = "/nonexistent"
	collector.conntrackPath = present
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)
	families := scrapeFamilies(t, registry)
	for i, want := range []float64{0x22, 0x33, 0x11} {
		if typ := typeOf(t, families, names[i]); typ != dto.MetricType_COUNTER {
			t.Errorf("%s is a %s, want a counter", names[i], typ)
		}
		if v := value(t, families, names[i], nil); v != want {
			t.Errorf("%s = %v, want %v", names[i], v, want)
		}
	}

	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte(conntrackHeader+"00000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		level      zapcore.Level
	}{
		{"missing", filepath.Join(dir, "missing"), zapcore.InfoLevel},
		{"broken", broken, zapcore.WarnLevel},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			collector := NewCollector("pgtender_", &fakeSource{clients: 1}, zap.New(core))
			collector.netstatPath = "/nonexistent"
			collector.conntrackPath = c.path
			registry := prometheus.NewRegistry()
			registry.MustRegister(collector)
			for range 3 {
				families := scrapeFamilies(t, registry)
				for _, name := range names {
					if families[name] != nil {
						t.Errorf("%s is in the scrape although %s gave no counters", name, c.path)
					}
				}
				if families["pgtender_clients"] == nil {
					t.Error("clients is missing: unreadable conntrack statistics must not hide the rest")
				}
			}
			entries := logs.FilterMessageSnippet("connection-tracking").AllUntimed()
			if len(entries) != 1 {
				t.Fatalf("logged %d times, want once: %v", len(entries), entries)
			}
			if entries[0].Level != c.level {
				t.Errorf("logged at %s, want %s", entries[0].Level, c.level)
			}
		})
	}
}

func FuzzParseConntrackStat(f *testing.F) {
	f.Add([]byte(conntrackHeader + conntrackRow("00000001", "00000002", "00000003")))
	f.Add([]byte("drop early_drop insert_failed\n1 2\n"))
	f.Add([]byte("drop early_drop insert_failed\nffffffffffffffff 0 0\nffffffffffffffff 0 0\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseConntrackStat(data)
	})
}
