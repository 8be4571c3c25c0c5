package kubernetes

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Where the chart mounts its files, and the paths pgtender is given.
const (
	configDir    = "/etc/pgtender"
	pgdogFile    = "pgdog.toml"
	usersFile    = "users.toml"
	tlsDirInPod  = "/etc/pgtender/tls/"
	metricPrefix = "pgtender_" // what deploy/grafana and deploy/prometheus expect
)

func TestHelmLint(t *testing.T) {
	for _, values := range [][]string{nil, {"-f", allValues}} {
		args := append([]string{"lint", chartDir, "--strict", "--kube-version", kubeVersion}, values...)
		out, err := runHelm(t, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm %s:\n%s", strings.Join(args, " "), out)
	}
}

// TestChartDefaults renders the chart with its default values.
func TestChartDefaults(t *testing.T) {
	o := decodeAll(t, renderChart(t))
	wantKinds(t, o, map[string]int{"ConfigMap": 1, "Secret": 1, "Service": 1, "Deployment": 1, "PodDisruptionBudget": 1})
	deployment := only[appsv1.Deployment](t, o)
	general := checkDeployment(t, o, deployment)

	if deployment.Spec.Replicas == nil || *deployment.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", deployment.Spec.Replicas)
	}
	if _, ok := deployment.Spec.Template.Annotations["checksum/config"]; !ok {
		t.Errorf("no checksum/config annotation: %v", deployment.Spec.Template.Annotations)
	}
	if sysctls := deployment.Spec.Template.Spec.SecurityContext.Sysctls; len(sysctls) != 0 {
		t.Errorf("sysctls set by default: %v (net.core.somaxconn is an unsafe sysctl, opt-in)", sysctls)
	}
	if general["listen_backlog"] != "1024" {
		t.Errorf("listen_backlog = %s, want pgtender's default 1024", general["listen_backlog"])
	}
	checkRenderedConfig(t, o)
}

// TestChartAllOptions renders the chart with every optional part on.
func TestChartAllOptions(t *testing.T) {
	o := decodeAll(t, renderChart(t, "-f", allValues))
	wantKinds(t, o, map[string]int{"ConfigMap": 1, "Secret": 1, "Service": 1, "Deployment": 1, "PodDisruptionBudget": 1,
		"HorizontalPodAutoscaler": 1, "serviceMonitor": 1, "podMonitor": 1})
	deployment := only[appsv1.Deployment](t, o)
	general := checkDeployment(t, o, deployment)
	pod := deployment.Spec.Template.Spec

	if deployment.Spec.Replicas != nil {
		t.Errorf("replicas = %d with the autoscaler on; the HPA owns it", *deployment.Spec.Replicas)
	}
	hpa := only[autoscalingv2.HorizontalPodAutoscaler](t, o)
	if hpa.Spec.ScaleTargetRef.Kind != "Deployment" || hpa.Spec.ScaleTargetRef.Name != deployment.Name {
		t.Errorf("HPA targets %+v, want Deployment %s", hpa.Spec.ScaleTargetRef, deployment.Name)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 8 {
		t.Errorf("HPA replicas %v..%d, want 3..8", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}

	// The sysctl, and the backlog pgtender is given, which it may not exceed.
	if len(pod.SecurityContext.Sysctls) != 1 || pod.SecurityContext.Sysctls[0] != (corev1.Sysctl{Name: "net.core.somaxconn", Value: "8192"}) {
		t.Errorf("sysctls = %v, want net.core.somaxconn=8192", pod.SecurityContext.Sysctls)
	}
	if general["listen_backlog"] != "4096" {
		t.Errorf("listen_backlog = %s, want 4096", general["listen_backlog"])
	}

	// rollOnChange false: no whole-config checksum, but one over the restart-only keys.
	annotations := deployment.Spec.Template.Annotations
	if _, ok := annotations["checksum/config"]; ok {
		t.Errorf("checksum/config set with config.rollOnChange false")
	}
	if annotations["checksum/restart-config"] == "" || annotations["example.com/team"] != "databases" {
		t.Errorf("pod annotations = %v, want checksum/restart-config and podAnnotations", annotations)
	}

	// The reloader: same process namespace, same user, locked down like pgtender.
	if pod.ShareProcessNamespace == nil || !*pod.ShareProcessNamespace {
		t.Error("reloader on but shareProcessNamespace is not true")
	}
	reloader := container(t, pod.Containers, "reloader")
	checkContainerSecurity(t, "reloader", reloader.SecurityContext)
	if !strings.Contains(strings.Join(reloader.Command, " "), "pkill -HUP -x pgtender") {
		t.Errorf("reloader command does not send SIGHUP to pgtender: %q", reloader.Command)
	}
	if reloader.Resources.Limits.Memory().IsZero() || reloader.Resources.Requests.Cpu().IsZero() {
		t.Errorf("reloader resources = %+v", reloader.Resources)
	}

	// TLS files come from the Secret through the same projected volume.
	if general["tls_certificate"] != `"`+tlsDirInPod+`tls.crt"` || general["tls_private_key"] != `"`+tlsDirInPod+`tls.key"` {
		t.Errorf("tls_certificate = %s, tls_private_key = %s", general["tls_certificate"], general["tls_private_key"])
	}
	if pod.PriorityClassName != "pgtender-critical" || len(pod.ImagePullSecrets) != 1 {
		t.Errorf("priorityClassName %q, imagePullSecrets %v", pod.PriorityClassName, pod.ImagePullSecrets)
	}
	if pod.TopologySpreadConstraints[0].WhenUnsatisfiable != corev1.ScheduleAnyway {
		t.Errorf("topology spread whenUnsatisfiable = %s", pod.TopologySpreadConstraints[0].WhenUnsatisfiable)
	}

	// The monitors select pgtender's pods or Service and name ports that exist.
	service := only[corev1.Service](t, o)
	sm := only[serviceMonitor](t, o)
	if !selects(sm.Spec.Selector.MatchLabels, service.Labels) || len(sm.Spec.Endpoints) != 1 ||
		!hasServicePort(service, sm.Spec.Endpoints[0].Port) || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor does not scrape the Service's metrics port: %+v", sm.Spec)
	}
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels = %v, want the extra label release=prometheus", sm.Labels)
	}
	pm := only[podMonitor](t, o)
	pgtender := container(t, pod.Containers, "pgtender")
	if !selects(pm.Spec.Selector.MatchLabels, deployment.Spec.Template.Labels) || len(pm.Spec.PodMetricsEndpoints) != 1 ||
		!hasContainerPort(pgtender, pm.Spec.PodMetricsEndpoints[0].Port) {
		t.Errorf("PodMonitor does not scrape the pods' metrics port: %+v", pm.Spec)
	}

	checkRenderedConfig(t, o)
}

// TestChartBacklogFollowsSomaxconn: with kernel.somaxconn set and no listenBacklog, the
// backlog pgtender is given is somaxconn.
func TestChartBacklogFollowsSomaxconn(t *testing.T) {
	o := decodeAll(t, renderChart(t, "--set", "kernel.somaxconn=16384"))
	general := tomlGeneral(t, configMapFile(t, o, pgdogFile))
	if general["listen_backlog"] != "16384" {
		t.Errorf("listen_backlog = %s, want 16384 (kernel.somaxconn)", general["listen_backlog"])
	}
	pod := only[appsv1.Deployment](t, o).Spec.Template.Spec
	if len(pod.SecurityContext.Sysctls) != 1 || pod.SecurityContext.Sysctls[0].Value != "16384" {
		t.Errorf("sysctls = %v", pod.SecurityContext.Sysctls)
	}
}

// TestChartExistingSecret: users.toml from a Secret the chart does not render.
func TestChartExistingSecret(t *testing.T) {
	o := decodeAll(t, renderChart(t, "--set", "users.existingSecret=my-users"))
	if n := count[corev1.Secret](o); n != 0 {
		t.Errorf("%d Secrets rendered with users.existingSecret", n)
	}
	pod := only[appsv1.Deployment](t, o).Spec.Template.Spec
	found := false
	for _, source := range volume(t, pod, "config").Projected.Sources {
		if source.Secret != nil && source.Secret.Name == "my-users" {
			found = true
		}
	}
	if !found {
		t.Errorf("the config volume does not project Secret my-users: %+v", volume(t, pod, "config").Projected.Sources)
	}
}

// TestChartChecksum: a change to the rendered files changes the pod template (so the pods
// roll) with rollOnChange; without it only a change to a key a reload cannot apply does.
func TestChartChecksum(t *testing.T) {
	annotation := func(key string, args ...string) string {
		t.Helper()
		deployment := only[appsv1.Deployment](t, decodeAll(t, renderChart(t, args...)))
		return deployment.Spec.Template.Annotations[key]
	}
	base := annotation("checksum/config")
	if base == "" {
		t.Fatal("no checksum/config by default")
	}
	if again := annotation("checksum/config"); again != base {
		t.Errorf("the checksum differs between two renders of the same values: %s, %s", base, again)
	}
	for _, change := range []string{
		"pgtender.general.default_pool_size=11", // pgdog.toml, reloadable
		"pgtender.databases[0].host=postgres-2", // pgdog.toml, a database
		"users.list[0].password=other",          // users.toml (the Secret)
		"pgtender.general.log_level=debug",      // a restart key
		"pgtender.shutdownTimeout=30000",        // a chart-owned key
	} {
		if got := annotation("checksum/config", "--set", change); got == base {
			t.Errorf("--set %s: checksum/config unchanged", change)
		}
	}

	noRoll := []string{"--set", "config.rollOnChange=false"}
	restartBase := annotation("checksum/restart-config", noRoll...)
	if restartBase == "" {
		t.Fatal("no checksum/restart-config with config.rollOnChange false")
	}
	for _, change := range []string{"pgtender.general.default_pool_size=11", "users.list[0].password=other", "pgtender.shutdownTimeout=30000"} {
		if got := annotation("checksum/restart-config", append(noRoll, "--set", change)...); got != restartBase {
			t.Errorf("--set %s (reloadable) changed checksum/restart-config", change)
		}
	}
	for _, change := range []string{"pgtender.general.log_level=debug", "pgtender.general.workers=4", "pgtender.listenBacklog=2048", "pgtender.port=5433"} {
		if got := annotation("checksum/restart-config", append(noRoll, "--set", change)...); got == restartBase {
			t.Errorf("--set %s (needs a restart) left checksum/restart-config unchanged", change)
		}
	}
}

// TestChartRefuses: values the chart must refuse rather than render.
func TestChartRefuses(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // in helm's error
	}{
		{[]string{"--set", "pgtender.general.port=5433"}, "general.port is set by the chart"},
		{[]string{"--set", "pgtender.general.shutdown_timeout=1000"}, "general.shutdown_timeout is set by the chart"},
		{[]string{"--set", "reloader.enabled=true"}, "reloader.enabled needs config.rollOnChange false"},
		{[]string{"--set", "kernel.somaxconn=512", "--set", "pgtender.listenBacklog=1024"}, "listenBacklog is above kernel.somaxconn"},
		{[]string{"--set", "pgtender.databases[0].extra.nested=1"}, "a map is not a TOML value"},
		{[]string{"--kube-version", "1.29.0"}, "chart requires kubeVersion"}, // no preStop sleep action
	} {
		_, err := renderChartErr(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("helm template %v: error %v, want one that says %q", c.args, err, c.want)
			continue
		}
		t.Logf("%v: refused: %s", c.args, c.want)
	}
}

// TestChartRestartKeys: the chart's list of keys a reload cannot change is exactly the keys
// pgtender's config package tags restart:"true".
func TestChartRestartKeys(t *testing.T) {
	source, err := os.ReadFile(filepath.Join(repoRoot, "config", "config.go"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, m := range regexp.MustCompile(`toml:"([a-z_]+)"\s+restart:"true"`).FindAllStringSubmatch(string(source), -1) {
		want = append(want, m[1])
	}
	helpers, err := os.ReadFile(filepath.Join(chartDir, "templates", "_helpers.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)define "pgtender.restartKeys" -}}\n(.*?)\n`).FindSubmatch(helpers)
	if m == nil {
		t.Fatal(`no define "pgtender.restartKeys" in _helpers.tpl`)
	}
	got := strings.Fields(string(m[1]))
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("chart restart keys %v, config.go restart keys %v", got, want)
	}
}

func wantKinds(t *testing.T, o objects, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, kind := range o.kinds() {
		got[kind]++
	}
	if len(got) != len(want) {
		t.Errorf("kinds rendered %v, want %v", got, want)
	}
	for kind, n := range want {
		if got[kind] != n {
			t.Errorf("%d %s rendered, want %d (all: %v)", got[kind], kind, n, got)
		}
	}
}

// checkDeployment checks what every rendering of the chart must have, and returns the
// [general] keys of the pgdog.toml it renders.
func checkDeployment(t *testing.T, o objects, deployment *appsv1.Deployment) map[string]string {
	t.Helper()
	general := tomlGeneral(t, configMapFile(t, o, pgdogFile))
	pod := deployment.Spec.Template.Spec
	pgtender := container(t, pod.Containers, "pgtender")

	if general["openmetrics_namespace"] != `"`+metricPrefix+`"` {
		t.Errorf("openmetrics_namespace = %s, want %q", general["openmetrics_namespace"], metricPrefix)
	}
	metricsPort := intKey(t, general, "openmetrics_port")
	clientPort := intKey(t, general, "port")
	if metricsPort == 0 {
		t.Fatal("openmetrics_port is 0: the probes have no endpoint")
	}
	if p := namedPort(t, pgtender, "metrics"); p != metricsPort {
		t.Errorf("container port metrics = %d, openmetrics_port = %d", p, metricsPort)
	}
	if p := namedPort(t, pgtender, "postgres"); p != clientPort {
		t.Errorf("container port postgres = %d, port = %d", p, clientPort)
	}

	// Probes: readiness on /readyz, liveness and startup on /healthz, all on the metrics port.
	for _, probe := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"readinessProbe", pgtender.ReadinessProbe, "/readyz"},
		{"livenessProbe", pgtender.LivenessProbe, "/healthz"},
		{"startupProbe", pgtender.StartupProbe, "/healthz"},
	} {
		if probe.probe == nil || probe.probe.HTTPGet == nil {
			t.Errorf("%s: not an HTTP probe: %+v", probe.name, probe.probe)
			continue
		}
		get := probe.probe.HTTPGet
		if get.Path != probe.path || resolvePort(t, pgtender, get.Port) != metricsPort {
			t.Errorf("%s: GET %s on port %s, want %s on %d", probe.name, get.Path, get.Port.String(), probe.path, metricsPort)
		}
	}

	// Termination: preStop sleep, then shutdown_readiness_delay, then shutdown_timeout, and the
	// grace period covers all three.
	if pgtender.Lifecycle == nil || pgtender.Lifecycle.PreStop == nil || pgtender.Lifecycle.PreStop.Sleep == nil || pgtender.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		t.Fatalf("no preStop sleep: %+v", pgtender.Lifecycle)
	}
	preStop := pgtender.Lifecycle.PreStop.Sleep.Seconds
	drainMillis := int64(intKey(t, general, "shutdown_timeout") + intKey(t, general, "shutdown_readiness_delay"))
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	grace := *pod.TerminationGracePeriodSeconds
	if grace*1000 <= preStop*1000+drainMillis {
		t.Errorf("terminationGracePeriodSeconds %d is not above preStop %d s + shutdown_readiness_delay + shutdown_timeout (%d ms)", grace, preStop, drainMillis)
	}
	t.Logf("grace %d s = preStop %d s + drain %d ms + margin", grace, preStop, drainMillis)

	// Security.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v", psc)
	}
	checkContainerSecurity(t, "pgtender", pgtender.SecurityContext)
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the service account token is mounted; pgtender does not talk to the API server")
	}
	for _, resource := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := pgtender.Resources.Requests[resource]; !ok {
			t.Errorf("no %s request", resource)
		}
		if _, ok := pgtender.Resources.Limits[resource]; !ok {
			t.Errorf("no %s limit", resource)
		}
	}

	// Spread over nodes, selecting this Deployment's own pods.
	spread := pod.TopologySpreadConstraints
	if len(spread) != 1 || spread[0].TopologyKey != "kubernetes.io/hostname" || spread[0].LabelSelector == nil ||
		!selects(spread[0].LabelSelector.MatchLabels, deployment.Spec.Template.Labels) {
		t.Errorf("topologySpreadConstraints = %+v", spread)
	}

	// A rollout keeps every replica serving: new pods are ready before old ones drain.
	rolling := deployment.Spec.Strategy.RollingUpdate
	if rolling == nil || rolling.MaxUnavailable == nil || rolling.MaxUnavailable.IntValue() != 0 {
		t.Errorf("rollingUpdate = %+v, want maxUnavailable 0", rolling)
	}
	if !selects(deployment.Spec.Selector.MatchLabels, deployment.Spec.Template.Labels) {
		t.Errorf("selector %v does not select the pod labels %v", deployment.Spec.Selector.MatchLabels, deployment.Spec.Template.Labels)
	}

	// pgtender reads the two files the projected volume provides, from the directory mounted
	// whole (a subPath mount would never see an update, so no reload could pick one up).
	wantArgs := []string{"--config", configDir + "/" + pgdogFile, "--users", configDir + "/" + usersFile}
	if !slices.Equal(pgtender.Args, wantArgs) {
		t.Errorf("args = %q, want %q", pgtender.Args, wantArgs)
	}
	mount := volumeMount(t, pgtender, configDir)
	if mount.SubPath != "" || !mount.ReadOnly {
		t.Errorf("config mount = %+v, want the whole volume, read-only", mount)
	}
	projected := volume(t, pod, mount.Name).Projected
	if projected == nil {
		t.Fatalf("volume %s is not projected", mount.Name)
	}
	paths := map[string]bool{}
	for _, source := range projected.Sources {
		var items []corev1.KeyToPath
		switch {
		case source.ConfigMap != nil:
			items = source.ConfigMap.Items
			if source.ConfigMap.Name != only[corev1.ConfigMap](t, o).Name {
				t.Errorf("projected ConfigMap %s is not the one rendered", source.ConfigMap.Name)
			}
		case source.Secret != nil:
			items = source.Secret.Items
		}
		for _, item := range items {
			paths[item.Path] = true
		}
	}
	if !paths[pgdogFile] || !paths[usersFile] {
		t.Errorf("the config volume provides %v, want %s and %s", paths, pgdogFile, usersFile)
	}

	// The Service sends clients and scrapes to the named container ports.
	service := only[corev1.Service](t, o)
	if !selects(service.Spec.Selector, deployment.Spec.Template.Labels) {
		t.Errorf("Service selector %v does not select the pods", service.Spec.Selector)
	}
	for _, port := range service.Spec.Ports {
		if resolvePort(t, pgtender, port.TargetPort) == 0 {
			t.Errorf("Service port %s targets %s, no such container port", port.Name, port.TargetPort.String())
		}
	}
	// Cancels are new connections: they must reach the replica holding the session.
	if service.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
		t.Errorf("Service sessionAffinity = %q, want ClientIP", service.Spec.SessionAffinity)
	}
	pdb := only[policyv1.PodDisruptionBudget](t, o)
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, deployment.Spec.Template.Labels) || pdb.Spec.MaxUnavailable == nil {
		t.Errorf("PodDisruptionBudget = %+v", pdb.Spec)
	}
	return general
}

func checkContainerSecurity(t *testing.T, name string, sc *corev1.SecurityContext) {
	t.Helper()
	switch {
	case sc == nil:
		t.Errorf("%s: no securityContext", name)
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot:
		t.Errorf("%s: runAsNonRoot not true", name)
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("%s: readOnlyRootFilesystem not true", name)
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("%s: allowPrivilegeEscalation not false", name)
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0:
		t.Errorf("%s: capabilities = %+v, want drop ALL", name, sc.Capabilities)
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		t.Errorf("%s: seccompProfile = %+v", name, sc.SeccompProfile)
	}
}

// checkRenderedConfig writes the rendered pgdog.toml and users.toml to a directory and runs
// pgtender --check-config on them. TLS paths point into the pod; they are pointed at a
// throwaway certificate here, since pgtender loads the files to check them.
func checkRenderedConfig(t *testing.T, o objects) {
	t.Helper()
	dir := t.TempDir()
	pgdog := configMapFile(t, o, pgdogFile)
	if strings.Contains(pgdog, tlsDirInPod) {
		writeCertificate(t, dir)
		pgdog = strings.ReplaceAll(pgdog, tlsDirInPod, dir+"/")
	}
	pgdogPath := filepath.Join(dir, pgdogFile)
	usersPath := filepath.Join(dir, usersFile)
	if err := os.WriteFile(pgdogPath, []byte(pgdog), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(usersPath, []byte(secretFile(t, o, usersFile)), 0o600); err != nil {
		t.Fatal(err)
	}
	checkConfig(t, pgdogPath, usersPath)
}

// writeCertificate writes a self-signed tls.crt and tls.key into dir.
func writeCertificate(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	template := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "pgtender"},
		DNSNames:     []string{"pgtender"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func configMapFile(t *testing.T, o objects, key string) string {
	t.Helper()
	for _, obj := range o.list {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			if text, ok := cm.Data[key]; ok {
				return text
			}
		}
	}
	t.Fatalf("no ConfigMap has %s", key)
	return ""
}

func secretFile(t *testing.T, o objects, key string) string {
	t.Helper()
	for _, obj := range o.list {
		if secret, ok := obj.(*corev1.Secret); ok {
			if text, ok := secret.StringData[key]; ok {
				return text
			}
			if data, ok := secret.Data[key]; ok {
				return string(data)
			}
		}
	}
	t.Fatalf("no Secret has %s", key)
	return ""
}

// tomlGeneral returns the `key = value` lines of the [general] table, values as written.
// The files here are rendered by the chart or written by hand in this repository, so a line
// reader is enough; pgtender --check-config reads them with its real parser.
func tomlGeneral(t *testing.T, text string) map[string]string {
	t.Helper()
	general := map[string]string{}
	in := false
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			in = line == "[general]"
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if in && ok && !strings.HasPrefix(line, "#") {
			general[strings.TrimSpace(key)] = strings.TrimSpace(value)
		}
	}
	if len(general) == 0 {
		t.Fatalf("no [general] keys in\n%s", text)
	}
	return general
}

func intKey(t *testing.T, general map[string]string, key string) int {
	t.Helper()
	n, err := strconv.Atoi(general[key])
	if err != nil {
		t.Fatalf("[general] %s = %q: %v", key, general[key], err)
	}
	return n
}

func container(t *testing.T, containers []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range containers {
		if containers[i].Name == name {
			return &containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func namedPort(t *testing.T, c *corev1.Container, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("container %s has no port %q", c.Name, name)
	return 0
}

// resolvePort returns the container port a probe or Service port refers to, by name or
// number; 0 if there is none.
func resolvePort(t *testing.T, c *corev1.Container, port intstr.IntOrString) int {
	t.Helper()
	for _, p := range c.Ports {
		if (port.Type == intstr.String && p.Name == port.StrVal) || (port.Type == intstr.Int && p.ContainerPort == port.IntVal) {
			return int(p.ContainerPort)
		}
	}
	return 0
}

func hasContainerPort(c *corev1.Container, name string) bool {
	for _, p := range c.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

func hasServicePort(s *corev1.Service, name string) bool {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

func volumeMount(t *testing.T, c *corev1.Container, path string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return m
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, path)
	return corev1.VolumeMount{}
}

func volume(t *testing.T, pod corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range pod.Volumes {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no volume %q", name)
	return corev1.Volume{}
}

// selects reports whether every label of selector is in labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}
