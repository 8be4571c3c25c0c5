package metrics

import (
	"net"
	"testing"
	"time"

	"github.com/pgtender/pgtender/pooler"
)

func figureMap(figures []pooler.LoginFigure) map[string]int64 {
	m := make(map[string]int64, len(figures))
	for _, f := range figures {
		m[f.Name] = f.Value
	}
	return m
}

// TestLoginRecorderFigures checks SHOW LOGINS's recorder rows against the
// events recorded: each result and stage counted in its own row, and the
// in-flight count.
func TestLoginRecorderFigures(t *testing.T) {
	r := NewLoginRecorder("")
	for range 6 {
		r.LoginStarted()
	}
	r.LoginFinished(pooler.LoginOK, pooler.LoginTimings{Total: time.Millisecond})
	r.LoginFinished(pooler.LoginOK, pooler.LoginTimings{})
	r.LoginFinished(pooler.LoginAuthFailed, pooler.LoginTimings{})
	r.LoginFinished(pooler.LoginShed, pooler.LoginTimings{})
	r.LoginAbandoned(pooler.StageAuth)
	got := figureMap(r.Figures())
	want := map[string]int64{
		"logins_in_flight": 1, "logins_ok": 2, "logins_auth_failed": 1, "logins_rejected": 0, "logins_shed": 1,
		"logins_error": 0, "logins_abandoned_startup": 0, "logins_abandoned_auth": 1, "logins_abandoned_ready": 0,
	}
	if len(got) != len(want) {
		t.Errorf("figures %v, want %v", got, want)
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %d, want %d", name, got[name], v)
		}
	}
}

// listenSockets is a ListenFigures source over real listeners.
type listenSockets []pooler.ListenSocket

func (l listenSockets) ListenSockets() []pooler.ListenSocket { return l }

// TestListenFigures reads a real listening socket's queue: its capacity
// is the backlog, and a connection nothing accepted is in its length.
func TestListenFigures(t *testing.T) {
	const backlog = 4
	if max := somaxconn(t); max < backlog {
		t.Skipf("net.core.somaxconn is %d, below the backlog of %d this test needs", max, backlog)
	}
	listener, socket := listenWithBacklog(t, backlog)
	socket.Worker = 3
	client, err := net.DialTimeout("tcp", listener.Addr().String(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	deadline := time.Now().Add(waitTimeout)
	for {
		got := figureMap(ListenFigures(listenSockets{socket}))
		if got["listen_queue_capacity.worker3"] != backlog {
			t.Fatalf("figures %v, want listen_queue_capacity.worker3 = %d", got, backlog)
		}
		if _, ok := got["listen_overflows"]; !ok {
			t.Fatalf("figures %v lack listen_overflows", got)
		}
		if got["listen_queue_length.worker3"] == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("figures %v, want listen_queue_length.worker3 = 1 with one connection not accepted", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
