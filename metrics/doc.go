// Package metrics is pgtender's Prometheus side: the login recorder the
// pooler reports logins through (LoginRecorder, an implementation of
// pooler.LoginRecorder), a collector that reads the pooler's own counters
// and the kernel's accept-queue and conntrack drop figures at scrape time
// (Collector), and the HTTP endpoints /metrics, /healthz and /readyz
// (Serve).
//
// The pooler knows nothing of Prometheus; this package imports it, never
// the other way. Metric names are prefixed by openmetrics_namespace
// verbatim, as PgDog does. docs/metrics.md lists every metric.
package metrics
