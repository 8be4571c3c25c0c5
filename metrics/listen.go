package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgtender/pgtender/pooler"
)

// collectListenQueues reports each listening socket's accept-queue length
// and capacity as the kernel sees them now. A socket whose figures cannot
// be read is left out: a made-up 0 would look like an empty queue.
func (c *Collector) collectListenQueues(ch chan<- prometheus.Metric) {
	for _, socket := range c.source.ListenSockets() {
		length, capacity, err := readListenQueue(socket.Conn)
		if err != nil {
			// A socket closed by a shutdown under way is not a problem.
			if !errors.Is(err, net.ErrClosed) && c.tcpInfoWarned.CompareAndSwap(false, true) {
				c.log.Warn("cannot read the accept queue of a listening socket (TCP_INFO); listen_queue_length and listen_queue_capacity are left out",
					zap.Int("worker", socket.Worker), zap.Error(err))
			}
			continue
		}
		worker := strconv.Itoa(socket.Worker)
		address := ""
		if socket.Addr != nil {
			address = socket.Addr.String()
		}
		ch <- prometheus.MustNewConstMetric(c.queueLength, prometheus.GaugeValue, float64(length), worker, address)
		ch <- prometheus.MustNewConstMetric(c.queueCapacity, prometheus.GaugeValue, float64(capacity), worker, address)
	}
}

// collectNetstat reports the namespace's ListenOverflows and ListenDrops.
func (c *Collector) collectNetstat(ch chan<- prometheus.Metric) {
	overflows, drops, err := readListenCounters(c.netstatPath)
	if err != nil {
		if c.netstatWarned.CompareAndSwap(false, true) {
			c.log.Warn("cannot read the kernel's listen counters; listen_overflows_total and listen_drops_total are left out",
				zap.String("path", c.netstatPath), zap.Error(err))
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.overflows, prometheus.CounterValue, float64(overflows))
	ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(drops))
}

// readListenCounters reads TcpExt ListenOverflows and ListenDrops from a
// /proc/net/netstat file.
func readListenCounters(path string) (overflows, drops uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	tcpExt, err := parseNetstat(data, "TcpExt")
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", path, err)
	}
	overflows, ok := tcpExt["ListenOverflows"]
	if !ok {
		return 0, 0, fmt.Errorf("%s: TcpExt has no ListenOverflows", path)
	}
	drops, ok = tcpExt["ListenDrops"]
	if !ok {
		return 0, 0, fmt.Errorf("%s: TcpExt has no ListenDrops", path)
	}
	return overflows, drops, nil
}

// parseNetstat returns the counters of one group of a /proc/net/netstat (or
// /proc/net/snmp) file. Each group is two lines with the same prefix, the
// first naming the counters and the second giving their values:
//
//	TcpExt: SyncookiesSent SyncookiesRecv ... ListenOverflows ListenDrops ...
//	TcpExt: 0 0 ... 12 12 ...
func parseNetstat(data []byte, group string) (map[string]uint64, error) {
	prefix := []byte(group + ":")
	lines := bytes.Split(data, []byte("\n"))
	for i := 0; i < len(lines); i++ {
		if !bytes.HasPrefix(lines[i], prefix) {
			continue
		}
		if i+1 >= len(lines) || !bytes.HasPrefix(lines[i+1], prefix) {
			return nil, fmt.Errorf("%s: a line of names without a line of values", group)
		}
		names := bytes.Fields(lines[i][len(prefix):])
		values := bytes.Fields(lines[i+1][len(prefix):])
		if len(names) != len(values) {
			return nil, fmt.Errorf("%s: %d names but %d values", group, len(names), len(values))
		}
		counters := make(map[string]uint64, len(names))
		for j, name := range names {
			v, err := strconv.ParseUint(string(values[j]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", group, name, err)
			}
			counters[string(name)] = v
		}
		return counters, nil
	}
	return nil, fmt.Errorf("no %s counters", group)
}

// ListenFigures are the kernel's accept-queue figures now, for the admin
// console's SHOW LOGINS: each listening socket's queue length and
// capacity (as listen_queue_length and listen_queue_capacity, a socket
// whose figures cannot be read left out) and the namespace's
// ListenOverflows and ListenDrops (left out when unreadable).
func ListenFigures(source interface{ ListenSockets() []pooler.ListenSocket }) []pooler.LoginFigure {
	var figures []pooler.LoginFigure
	for _, socket := range source.ListenSockets() {
		length, capacity, err := readListenQueue(socket.Conn)
		if err != nil {
			continue
		}
		worker := strconv.Itoa(socket.Worker)
		figures = append(figures,
			pooler.LoginFigure{Name: "listen_queue_length.worker" + worker, Value: int64(length)},
			pooler.LoginFigure{Name: "listen_queue_capacity.worker" + worker, Value: int64(capacity)})
	}
	if overflows, drops, err := readListenCounters(procNetstat); err == nil {
		figures = append(figures,
			pooler.LoginFigure{Name: "listen_overflows", Value: int64(overflows)},
			pooler.LoginFigure{Name: "listen_drops", Value: int64(drops)})
	}
	return figures
}
