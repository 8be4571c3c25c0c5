// Package kubernetes checks the Kubernetes files of pgtender without a cluster: the Helm chart
// in deploy/helm/pgtender and the sidecar manifests in deploy/kubernetes/sidecar. It is a Go
// module of its own so that k8s.io/api stays out of pgtender's dependencies, and it has only
// tests.
//
// The checks:
//   - helm lint passes, and helm template renders, with the chart's default values and with
//     every optional part on (testdata/values-all.yaml);
//   - every rendered object, and every sidecar manifest, decodes strictly into its k8s.io/api
//     type (or a small local type for the Prometheus Operator's objects): an unknown kind or an
//     unknown field is an error;
//   - the probes, the grace period against shutdown_timeout, the preStop sleep, the security
//     context, the sysctl and the backlog, the checksum annotation;
//   - the pgdog.toml and users.toml they render pass `pgtender --check-config`.
//
// helm is built from the Go module proxy into the user's cache directory (the first build takes
// minutes; later runs reuse the binary), pgtender from this repository; the tests fail, not
// skip, when either cannot be built.
package kubernetes

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// helmModule is the helm CLI the tests run, from the Go module proxy.
	helmModule = "helm.sh/helm/v4/cmd/helm@v4.3.2"
	// kubeVersion is the cluster version helm renders for; the chart needs 1.30 or later
	// (the preStop sleep action), and helm's own default is older.
	kubeVersion = "1.33.0"
	chartDir    = "../helm/pgtender"
	sidecarDir  = "sidecar"
	allValues   = "testdata/values-all.yaml"
	repoRoot    = "../.."
	buildBudget = 25 * time.Minute
	runBudget   = 2 * time.Minute
)

// tools holds the binaries built once per test run.
var tools struct {
	once     sync.Once
	dir      string
	helm     string
	pgtender string
	err      error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tools.dir != "" {
		os.RemoveAll(tools.dir)
	}
	os.Exit(code)
}

// buildTools builds helm and pgtender into one temporary directory, once.
func buildTools() {
	dir, err := os.MkdirTemp("", "pgtender-k8s-test-")
	if err != nil {
		tools.err = err
		return
	}
	tools.dir = dir
	ctx, cancel := context.WithTimeout(context.Background(), buildBudget)
	defer cancel()

	helm, err := installHelm(ctx)
	if err != nil {
		tools.err = err
		return
	}
	tools.helm = helm

	root, err := filepath.Abs(repoRoot)
	if err != nil {
		tools.err = err
		return
	}
	tools.pgtender = filepath.Join(dir, "pgtender")
	build := exec.CommandContext(ctx, "go", "build", "-o", tools.pgtender, "./cmd/pgtender")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		tools.err = fmt.Errorf("go build ./cmd/pgtender in %s: %v\n%s", root, err, out)
	}
}

// installHelm returns the helm binary, built once into the user's cache directory (its
// directory is named after the version, so a new version is a new build). go install with a
// version builds outside any module, from the Go module proxy.
func installHelm(ctx context.Context) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for helm: %w", err)
	}
	_, version, _ := strings.Cut(helmModule, "@")
	dir := filepath.Join(cache, "pgtender", "helm-"+version)
	helm := filepath.Join(dir, "helm")
	if exec.CommandContext(ctx, helm, "version").Run() == nil {
		return helm, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	install := exec.CommandContext(ctx, "go", "install", helmModule)
	install.Env = append(os.Environ(), "GOBIN="+dir)
	if out, err := install.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s: %v\n%s", helmModule, err, out)
	}
	return helm, nil
}

func needTools(t *testing.T) {
	t.Helper()
	tools.once.Do(buildTools)
	if tools.err != nil {
		t.Fatalf("cannot build the tools these tests need: %v", tools.err)
	}
}

// runHelm runs helm with args and returns its standard output; stderr goes into the error.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	needTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBudget)
	defer cancel()
	cmd := exec.CommandContext(ctx, tools.helm, args...)
	// A helm of its own: no user's repositories, plugins or cache.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// renderChart runs helm template with the given extra arguments (-f, --set).
func renderChart(t *testing.T, extra ...string) string {
	t.Helper()
	out, err := renderChartErr(t, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func renderChartErr(t *testing.T, extra ...string) (string, error) {
	t.Helper()
	args := append([]string{"template", "db", chartDir, "--namespace", "databases", "--kube-version", kubeVersion}, extra...)
	return runHelm(t, args...)
}

// checkConfig runs pgtender --check-config on the two files.
func checkConfig(t *testing.T, pgdogPath, usersPath string) {
	t.Helper()
	needTools(t)
	ctx, cancel := context.WithTimeout(context.Background(), runBudget)
	defer cancel()
	out, err := exec.CommandContext(ctx, tools.pgtender, "--check-config", "--config", pgdogPath, "--users", usersPath).CombinedOutput()
	if err != nil {
		t.Fatalf("pgtender --check-config rejects the rendered files: %v\n%s", err, out)
	}
	t.Logf("pgtender --check-config: %s", strings.TrimSpace(string(out)))
}
