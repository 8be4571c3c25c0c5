package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Toxiproxy (github.com/Shopify/toxiproxy) between pgtender and Postgres, to
// stall, slow or cut the network path. Its server is built once from the
// module proxy, at the version below, into the user's cache directory, and
// run as a process of its own on loopback; tests drive it through its HTTP
// API (README.md of the project: "HTTP API"), so the main module does not
// depend on it.
const toxiproxyModule = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0"

var (
	toxiproxyOnce   sync.Once
	toxiproxyBinary string
	toxiproxyErr    error
)

// toxiproxyServerBinary builds the Toxiproxy server once per machine.
func toxiproxyServerBinary(t testing.TB) string {
	t.Helper()
	toxiproxyOnce.Do(func() {
		// The user's cache directory, or the temporary one where there is
		// none or it cannot be written (a user without a home).
		dir := filepath.Join(os.TempDir(), "pgtender-test-tools", "toxiproxy-v2.5.0")
		if cache, err := os.UserCacheDir(); err == nil {
			if cached := filepath.Join(cache, "pgtender-test-tools", "toxiproxy-v2.5.0"); os.MkdirAll(cached, 0o755) == nil {
				dir = cached
			}
		}
		toxiproxyBinary = filepath.Join(dir, "toxiproxy-server")
		if _, err := os.Stat(toxiproxyBinary); err == nil {
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			toxiproxyErr = err
			return
		}
		staging, err := os.MkdirTemp(dir, "build-")
		if err != nil {
			toxiproxyErr = err
			return
		}
		defer os.RemoveAll(staging)
		cmd := exec.Command("go", "install", toxiproxyModule)
		cmd.Dir = staging // outside this module: go install pkg@version ignores it anyway
		cmd.Env = append(os.Environ(), "GOBIN="+staging)
		if out, err := cmd.CombinedOutput(); err != nil {
			toxiproxyErr = fmt.Errorf("go install %s: %v\n%s", toxiproxyModule, err, out)
			return
		}
		toxiproxyErr = os.Rename(filepath.Join(staging, "server"), toxiproxyBinary)
	})
	if toxiproxyErr != nil {
		t.Fatal(toxiproxyErr)
	}
	return toxiproxyBinary
}

// toxiproxy is a running Toxiproxy server.
type toxiproxy struct {
	t   testing.TB
	api string // http://127.0.0.1:port
}

// startToxiproxy runs a Toxiproxy server on a free loopback port until the
// end of the test.
func startToxiproxy(t testing.TB) *toxiproxy {
	t.Helper()
	bin := toxiproxyServerBinary(t)
	port := freePort(t)
	cmd := exec.Command(bin, "-host", "127.0.0.1", "-port", strconv.Itoa(port))
	cmd.Env = append(os.Environ(), "LOG_LEVEL=warn") // its trace and info lines would bury pgtender's
	logs, _ := startChild(t, cmd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("toxiproxy log:\n%s", logs.String())
		}
	})
	tp := &toxiproxy{t: t, api: fmt.Sprintf("http://127.0.0.1:%d", port)}
	eventually(t, 20*time.Second, "toxiproxy to answer", func() bool {
		resp, err := http.Get(tp.api + "/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return tp
}

// call sends one API request and fails the test unless it succeeds.
func (tp *toxiproxy) call(method, path string, body any) {
	tp.t.Helper()
	var payload io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			tp.t.Fatal(err)
		}
		payload = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, tp.api+path, payload)
	if err != nil {
		tp.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tp.t.Fatalf("toxiproxy %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		tp.t.Fatalf("toxiproxy %s %s: %s: %s", method, path, resp.Status, answer)
	}
}

// proxy makes a proxy to upstream and returns the loopback address it
// listens on.
func (tp *toxiproxy) proxy(name, upstream string) string {
	tp.t.Helper()
	listen := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(tp.t)))
	tp.call(http.MethodPost, "/proxies", map[string]any{"name": name, "listen": listen, "upstream": upstream, "enabled": true})
	return listen
}

// addToxic adds a toxic to a proxy's stream ("upstream": towards Postgres,
// "downstream": towards pgtender), for every connection, open or new.
func (tp *toxiproxy) addToxic(proxy, name, typ, stream string, attributes map[string]any) {
	tp.t.Helper()
	tp.call(http.MethodPost, "/proxies/"+proxy+"/toxics", map[string]any{
		"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attributes,
	})
}

func (tp *toxiproxy) removeToxic(proxy, name string) {
	tp.t.Helper()
	tp.call(http.MethodDelete, "/proxies/"+proxy+"/toxics/"+name, nil)
}

// setEnabled turns a proxy off (it closes every connection through it and
// refuses new ones) or on again.
func (tp *toxiproxy) setEnabled(proxy string, enabled bool) {
	tp.t.Helper()
	tp.call(http.MethodPost, "/proxies/"+proxy, map[string]any{"enabled": enabled})
}

// stall makes a proxy's stream carry nothing, without closing anything
// (Toxiproxy's timeout toxic with timeout 0), as a network path that stopped
// delivering: no error, no reset, no FIN.
func (tp *toxiproxy) stall(proxy, stream string) (restore func()) {
	tp.t.Helper()
	name := "stall_" + stream
	tp.addToxic(proxy, name, "timeout", stream, map[string]any{"timeout": 0})
	return func() { tp.removeToxic(proxy, name) }
}

// withTimeout is a context for one client operation in a fault test.
func withTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
