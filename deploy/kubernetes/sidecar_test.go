package kubernetes

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// readSidecar decodes every manifest in sidecar/ strictly.
func readSidecar(t *testing.T) objects {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(sidecarDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", sidecarDir, err)
	}
	var all objects
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		o := decodeAll(t, string(text))
		all.list = append(all.list, o.list...)
	}
	return all
}

// TestSidecar checks the native-sidecar example: pgtender is an init container with
// restartPolicy Always, started (its startup probe passed) before the app, reached on
// loopback, and stopped after the app within the grace period.
func TestSidecar(t *testing.T) {
	o := readSidecar(t)
	wantKinds(t, o, map[string]int{"ConfigMap": 1, "Secret": 1, "Deployment": 1})
	deployment := only[appsv1.Deployment](t, o)
	pod := deployment.Spec.Template.Spec
	general := tomlGeneral(t, configMapFile(t, o, pgdogFile))

	if len(pod.InitContainers) != 1 {
		t.Fatalf("init containers: %d, want pgtender alone", len(pod.InitContainers))
	}
	pgtender := container(t, pod.InitContainers, "pgtender")
	if pgtender.RestartPolicy == nil || *pgtender.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("pgtender restartPolicy = %v, want Always (a native sidecar)", pgtender.RestartPolicy)
	}
	metricsPort := intKey(t, general, "openmetrics_port")
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		// The kubelet starts the app container only once a sidecar's startup probe passes.
		{"startupProbe", pgtender.StartupProbe, "/healthz"},
		{"readinessProbe", pgtender.ReadinessProbe, "/readyz"},
		{"livenessProbe", pgtender.LivenessProbe, "/healthz"},
	} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			t.Errorf("%s: not an HTTP probe", probe.name)
			continue
		}
		if probe.probe.HTTPGet.Path != probe.path || resolvePort(t, pgtender, probe.probe.HTTPGet.Port) != metricsPort {
			t.Errorf("%s: GET %s on %s, want %s on %d", probe.name, probe.probe.HTTPGet.Path, probe.probe.HTTPGet.Port.String(), probe.path, metricsPort)
		}
	}
	if general["openmetrics_namespace"] != `"`+metricPrefix+`"` {
		t.Errorf("openmetrics_namespace = %s", general["openmetrics_namespace"])
	}

	// Only the pod reaches the pooler: it listens on loopback, where the app connects.
	if general["host"] != `"127.0.0.1"` {
		t.Errorf("host = %s, want \"127.0.0.1\"", general["host"])
	}
	app := container(t, pod.Containers, "app")
	env := map[string]string{}
	for _, e := range app.Env {
		env[e.Name] = e.Value
	}
	if env["DATABASE_HOST"] != "127.0.0.1" || env["DATABASE_PORT"] != strconv.Itoa(intKey(t, general, "port")) {
		t.Errorf("app connects to %s:%s, want 127.0.0.1:%s", env["DATABASE_HOST"], env["DATABASE_PORT"], general["port"])
	}

	// The grace period covers the app's preStop and pgtender's drain after it.
	if app.Lifecycle == nil || app.Lifecycle.PreStop == nil || app.Lifecycle.PreStop.Sleep == nil {
		t.Fatal("app: no preStop sleep")
	}
	drain := int64(intKey(t, general, "shutdown_timeout"))
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds*1000 <= app.Lifecycle.PreStop.Sleep.Seconds*1000+drain {
		t.Errorf("terminationGracePeriodSeconds %v is not above the app's preStop (%d s) + shutdown_timeout (%d ms)",
			pod.TerminationGracePeriodSeconds, app.Lifecycle.PreStop.Sleep.Seconds, drain)
	}

	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("pod securityContext = %+v", pod.SecurityContext)
	}
	checkContainerSecurity(t, "pgtender", pgtender.SecurityContext)
	checkContainerSecurity(t, "app", app.SecurityContext)
	for _, c := range []*corev1.Container{pgtender, app} {
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources = %+v", c.Name, c.Resources)
		}
	}

	wantArgs := []string{"--config", configDir + "/" + pgdogFile, "--users", configDir + "/" + usersFile}
	if !slices.Equal(pgtender.Args, wantArgs) {
		t.Errorf("args = %q, want %q", pgtender.Args, wantArgs)
	}
	mount := volumeMount(t, pgtender, configDir)
	projected := volume(t, pod, mount.Name).Projected
	if mount.SubPath != "" || projected == nil {
		t.Fatalf("config mount %+v, volume %+v", mount, volume(t, pod, mount.Name))
	}
	names := map[string]bool{}
	for _, source := range projected.Sources {
		if source.ConfigMap != nil {
			names[source.ConfigMap.Name] = true
		}
		if source.Secret != nil {
			names[source.Secret.Name] = true
		}
	}
	if !names[only[corev1.ConfigMap](t, o).Name] || !names[only[corev1.Secret](t, o).Name] {
		t.Errorf("the config volume projects %v, not the ConfigMap and Secret beside it", names)
	}

	dir := t.TempDir()
	pgdogPath, usersPath := filepath.Join(dir, pgdogFile), filepath.Join(dir, usersFile)
	if err := os.WriteFile(pgdogPath, []byte(configMapFile(t, o, pgdogFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	users := secretFile(t, o, usersFile)
	if !strings.Contains(users, "[[users]]") {
		t.Errorf("users.toml has no [[users]] entry:\n%s", users)
	}
	if err := os.WriteFile(usersPath, []byte(users), 0o600); err != nil {
		t.Fatal(err)
	}
	checkConfig(t, pgdogPath, usersPath)
}
