package metrics

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseNetstat(t *testing.T) {
	const tcpExt = "TcpExt: SyncookiesSent ListenOverflows ListenDrops TCPTimeouts\n" +
		"TcpExt: 0 12 15 18446744073709551615\n"
	const ipExt = "IpExt: InNoRoutes InOctets\nIpExt: 1 2\n"
	for _, c := range []struct {
		name, data, group string
		want              map[string]uint64
		err               string
	}{
		{"TcpExt first", tcpExt + ipExt, "TcpExt",
			map[string]uint64{"SyncookiesSent": 0, "ListenOverflows": 12, "ListenDrops": 15, "TCPTimeouts": 1<<64 - 1}, ""},
		{"TcpExt after another group", ipExt + tcpExt, "TcpExt",
			map[string]uint64{"SyncookiesSent": 0, "ListenOverflows": 12, "ListenDrops": 15, "TCPTimeouts": 1<<64 - 1}, ""},
		{"another group", tcpExt + ipExt, "IpExt", map[string]uint64{"InNoRoutes": 1, "InOctets": 2}, ""},
		{"no trailing newline", strings.TrimSuffix(tcpExt, "\n"), "TcpExt",
			map[string]uint64{"SyncookiesSent": 0, "ListenOverflows": 12, "ListenDrops": 15, "TCPTimeouts": 1<<64 - 1}, ""},
		{"group missing", ipExt, "TcpExt", nil, "no TcpExt counters"},
		{"empty", "", "TcpExt", nil, "no TcpExt counters"},
		{"names without values", "TcpExt: ListenOverflows ListenDrops\n", "TcpExt", nil, "without a line of values"},
		{"names then another group", "TcpExt: ListenOverflows ListenDrops\n" + ipExt, "TcpExt", nil, "without a line of values"},
		{"fewer values", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1\n", "TcpExt", nil, "2 names but 1 values"},
		{"not a number", "TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 x\n", "TcpExt", nil, "ListenDrops"},
		{"negative", "TcpExt: ListenOverflows\nTcpExt: -1\n", "TcpExt", nil, "ListenOverflows"},
		{"prefix of another group's name", "TcpExtra: A\nTcpExtra: 1\n", "TcpExt", nil, "no TcpExt counters"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseNetstat([]byte(c.data), c.group)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("parseNetstat: error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseNetstat: %v", err)
			}
			if !maps.Equal(got, c.want) {
				t.Errorf("parseNetstat = %v, want %v", got, c.want)
			}
		})
	}
}

func TestReadListenCounters(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	overflows, drops, err := readListenCounters(write("ok", "TcpExt: ListenDrops X ListenOverflows\nTcpExt: 9 1 7\n"))
	if err != nil || overflows != 7 || drops != 9 {
		t.Errorf("readListenCounters = %d, %d, %v; want 7, 9, nil", overflows, drops, err)
	}
	if _, _, err := readListenCounters(write("no-drops", "TcpExt: ListenOverflows\nTcpExt: 7\n")); err == nil || !strings.Contains(err.Error(), "ListenDrops") {
		t.Errorf("a TcpExt without ListenDrops: error %v", err)
	}
	if _, _, err := readListenCounters(write("no-overflows", "TcpExt: ListenDrops\nTcpExt: 7\n")); err == nil || !strings.Contains(err.Error(), "ListenOverflows") {
		t.Errorf("a TcpExt without ListenOverflows: error %v", err)
	}
	if _, _, err := readListenCounters(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("a missing file: error %v, want not-exist", err)
	}
}

// TestReadListenCountersProc reads this machine's real /proc/net/netstat.
func TestReadListenCountersProc(t *testing.T) {
	if _, err := os.Stat(procNetstat); os.IsNotExist(err) {
		t.Skipf("%s does not exist on this system (not Linux?): the kernel listen counters cannot be read here", procNetstat)
	}
	overflows, drops, err := readListenCounters(procNetstat)
	if err != nil {
		t.Fatalf("reading %s: %v", procNetstat, err)
	}
	// Every overflow is also counted as a drop (tcp_listendrop).
	if drops < overflows {
		t.Errorf("ListenDrops = %d < ListenOverflows = %d", drops, overflows)
	}
	t.Logf("%s: ListenOverflows %d, ListenDrops %d", procNetstat, overflows, drops)
}

func FuzzParseNetstat(f *testing.F) {
	f.Add([]byte("TcpExt: ListenOverflows ListenDrops\nTcpExt: 1 2\n"))
	f.Add([]byte("TcpExt: A\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = parseNetstat(data, "TcpExt")
	})
}
