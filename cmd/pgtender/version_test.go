package main

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

func TestBuildVersion(t *testing.T) {
	goVersion := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	stamped := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"},
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.modified", Value: "false"},
	}}
	modified := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
		{Key: "vcs.modified", Value: "true"},
	}}
	installed := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}
	for _, tc := range []struct {
		name            string
		version, commit string
		info            *debug.BuildInfo
		want            string
	}{
		{"no build info", "dev", "", nil, "pgtender dev commit unknown " + goVersion},
		{"vcs stamp", "1.2.0", "", stamped, "pgtender 1.2.0 commit 0123456789abcdef0123456789abcdef01234567 " + goVersion},
		{"modified tree", "dev", "", modified, "pgtender dev commit 0123456789abcdef0123456789abcdef01234567 (modified) " + goVersion},
		{"-X commit without a stamp", "1.2.0", "feedbeef", &debug.BuildInfo{}, "pgtender 1.2.0 commit feedbeef " + goVersion},
		{"the stamp wins over -X commit", "1.2.0", "feedbeef", stamped, "pgtender 1.2.0 commit 0123456789abcdef0123456789abcdef01234567 " + goVersion},
		{"go install module@version", "dev", "", installed, "pgtender v1.4.0 commit unknown " + goVersion},
		{"-X version wins over the module's", "1.5.0-rc1", "", installed, "pgtender 1.5.0-rc1 commit unknown " + goVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := makeBuildVersion(tc.version, tc.commit, tc.info).String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestVersionOfBuiltBinary builds pgtender as a release would (the version
// by -ldflags -X, the commit stamped by the Go toolchain from the checkout)
// and checks what --version prints. -buildvcs=true is explicit because
// GOFLAGS may turn stamping off.
func TestVersionOfBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	before, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (git rev-parse HEAD: %v): no commit to compare with", err)
	}
	binary := filepath.Join(t.TempDir(), "pgtender")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X main.version=9.8.7-test", "-o", binary, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Others may commit while it builds: either commit is right.
	after, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(binary, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("pgtender --version: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	t.Logf("pgtender --version: %s", line)
	// Uncommitted changes anywhere in the checkout mark the build
	// modified, which a developer's tree often is: either form is right.
	goVersion := runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	var want []string
	for _, revision := range []string{string(before), string(after)} {
		prefix := "pgtender 9.8.7-test commit " + strings.TrimSpace(revision)
		want = append(want, prefix+" "+goVersion, prefix+" (modified) "+goVersion)
	}
	if !slices.Contains(want, line) {
		t.Fatalf("--version printed %q, want one of %q", line, want)
	}
}

func TestHealthcheck(t *testing.T) {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			fmt.Fprintln(w, "ok")
		case "/readyz":
			http.Error(w, "draining", http.StatusServiceUnavailable)
		default:
			http.NotFound(w, r)
		}
	}))
	defer server.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	for _, tc := range []struct {
		url, want string
		code      int
	}{
		{server.URL + "/healthz", "200 OK ok", 0},
		{server.URL + "/readyz", "503 Service Unavailable draining", 1},
		{server.URL + "/nope", "404 Not Found", 1},
		{closedURL + "/healthz", "connection refused", 1},
		{"::not a url", "missing protocol scheme", 1},
	} {
		var stdout, stderr bytes.Buffer
		code := healthcheck(tc.url, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.want) {
			t.Errorf("healthcheck(%s) = %d, stdout %q, stderr %q; want %d and %q", tc.url, code, stdout.String(), stderr.String(), tc.code, tc.want)
		}
	}
}
