package pooler

import "sync/atomic"

// ClientTimeouts counts the clients pgtender disconnected because a
// timeout ran out, since it started: Write, a client that took none of
// pgtender's output within client_write_timeout.
type ClientTimeouts struct {
	Write uint64
}

// clientTimeoutCounters are the atomics behind ClientTimeouts.
type clientTimeoutCounters struct {
	write atomic.Uint64
}

// ClientTimeouts returns the client timeout counters now.
func (p *Pooler) ClientTimeouts() ClientTimeouts {
	return ClientTimeouts{Write: p.clientTimeouts.write.Load()}
}
