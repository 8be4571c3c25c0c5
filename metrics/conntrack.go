package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// procConntrackStat is where the kernel's connection-tracking statistics
// of the process's network namespace are. The file exists only where the
// kernel has conntrack (built in, or the nf_conntrack module loaded), and
// it counts the namespace pgtender runs in: a pod's own, or the node's
// with hostNetwork. The stat table is per namespace (net->ct.stat
// in net/netfilter/nf_conntrack_standalone.c,
// https://elixir.bootlin.com/linux/latest/source/net/netfilter/nf_conntrack_standalone.c).
const procConntrackStat = "/proc/net/stat/nf_conntrack"

// conntrackCounters are the connection-tracking counters that mean a
// packet, or a connection's tracking entry, was lost before any socket saw
// it, summed over every CPU.
type conntrackCounters struct {
	// Drop counts packets dropped because no tracking entry could be made
	// for them, mostly because the table was full (nf_conntrack_max) and no
	// entry could be evicted; the kernel then logs "nf_conntrack: table
	// full, dropping packet".
	Drop uint64
	// EarlyDrop counts entries of not yet established connections evicted
	// to make room in a full table.
	EarlyDrop uint64
	// InsertFailed counts packets dropped because their new entry clashed
	// with one inserted at the same moment (two CPUs racing on one flow, or
	// a NAT port clash) and the clash could not be resolved.
	InsertFailed uint64
}

// conntrackColumns are the columns of /proc/net/stat/nf_conntrack the
// collector reads, by their names in the file's header line.
var conntrackColumns = []string{"drop", "early_drop", "insert_failed"}

// readConntrackCounters reads and parses a /proc/net/stat/nf_conntrack
// file. A missing file is returned as an error satisfying
// errors.Is(err, fs.ErrNotExist).
func readConntrackCounters(path string) (conntrackCounters, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return conntrackCounters{}, err
	}
	counters, err := parseConntrackStat(data)
	if err != nil {
		return conntrackCounters{}, fmt.Errorf("%s: %w", path, err)
	}
	return counters, nil
}

// parseConntrackStat sums the drop, early_drop and insert_failed columns
// of a /proc/net/stat/nf_conntrack file over its rows. The file is a
// header line naming the columns, then one row per possible CPU of the
// same number of hexadecimal fields (ct_cpu_seq_show in
// net/netfilter/nf_conntrack_standalone.c prints each with %08x):
//
//	entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
//	00000003  00000000 00000000 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000
//
// Columns are found by name, not position: kernels have renamed and
// retired columns over time (searched became clashres, delete_list became
// chainlength), and the ones read here have kept their names. The
// entries column is the table's size, repeated on every row, and is not
// summed. Each per-CPU value is 32 bits wide in the kernel and wraps; the
// sum then goes down, which Prometheus's rate() and increase() take as a
// counter reset.
func parseConntrackStat(data []byte) (conntrackCounters, error) {
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) == 0 || len(bytes.Fields(lines[0])) == 0 {
		return conntrackCounters{}, errors.New("no header line")
	}
	names := bytes.Fields(lines[0])
	index := make(map[string]int, len(names))
	for i, name := range names {
		index[string(name)] = i
	}
	columns := make([]int, len(conntrackColumns))
	for i, name := range conntrackColumns {
		j, ok := index[name]
		if !ok {
			return conntrackCounters{}, fmt.Errorf("no %s column in the header", name)
		}
		columns[i] = j
	}
	sums := make([]uint64, len(conntrackColumns))
	rows := 0
	for n, line := range lines[1:] {
		values := bytes.Fields(line)
		if len(values) == 0 {
			continue // the final newline
		}
		if len(values) != len(names) {
			return conntrackCounters{}, fmt.Errorf("row %d: %d values for %d columns", n+1, len(values), len(names))
		}
		for i, j := range columns {
			v, err := strconv.ParseUint(string(values[j]), 16, 64)
			if err != nil {
				return conntrackCounters{}, fmt.Errorf("row %d %s: %w", n+1, conntrackColumns[i], err)
			}
			sums[i] += v
		}
		rows++
	}
	if rows == 0 {
		return conntrackCounters{}, errors.New("no per-CPU rows")
	}
	return conntrackCounters{Drop: sums[0], EarlyDrop: sums[1], InsertFailed: sums[2]}, nil
}

// collectConntrack reports the namespace's conntrack drop counters. Where
// the kernel does not track connections there is no file, and the three
// metrics are left out: no series at all, since a 0 would claim that
// nothing was dropped. The absence is logged once at info (it is the
// normal case on a host without NAT or a stateful firewall); any other
// read or parse failure is logged once as a warning.
func (c *Collector) collectConntrack(ch chan<- prometheus.Metric) {
	counters, err := readConntrackCounters(c.conntrackPath)
	if err != nil {
		if c.conntrackWarned.CompareAndSwap(false, true) {
			if errors.Is(err, fs.ErrNotExist) {
				c.log.Info("the kernel has no connection-tracking statistics here (nf_conntrack not loaded); conntrack_drops_total, conntrack_early_drops_total and conntrack_insert_failed_total are left out",
					zap.String("path", c.conntrackPath))
			} else {
				c.log.Warn("cannot read the kernel's connection-tracking statistics; conntrack_drops_total, conntrack_early_drops_total and conntrack_insert_failed_total are left out",
					zap.String("path", c.conntrackPath), zap.Error(err))
			}
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.conntrackDrops, prometheus.CounterValue, float64(counters.Drop))
	ch <- prometheus.MustNewConstMetric(c.conntrackEarlyDrops, prometheus.CounterValue, float64(counters.EarlyDrop))
	ch <- prometheus.MustNewConstMetric(c.conntrackInsertFailed, prometheus.CounterValue, float64(counters.InsertFailed))
}
