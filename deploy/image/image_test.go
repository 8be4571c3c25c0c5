package main

import (
	"archive/tar"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// repo is the pgtender checkout this module sits in.
const repo = "../.."

const testVersion = "0.0.0-imagetest"

// TestImage builds the image as CI does, writes the OCI archive, reads it
// back as a consumer would and checks what is in it: the run configuration,
// the layer's files, static binaries, and that the pgtender binary taken
// out of the layer runs --version (and, as root, runs the image's
// entrypoint the way a container runtime would).
func TestImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Others may commit to the checkout while it builds: the stamp names
	// the commit of one moment in between.
	headBefore := gitHead(t)
	opts, err := BuildBinaries(ctx, repo, t.TempDir(), testVersion, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	if headAfter := gitHead(t); opts.Commit != headBefore && opts.Commit != headAfter {
		t.Fatalf("the binary is stamped with commit %s, the checkout was at %s then %s", opts.Commit, headBefore, headAfter)
	}
	revision := opts.Commit
	for _, binary := range []string{opts.Pgtender, opts.Loginstorm} {
		assertStatic(t, binary)
	}
	opts.CACertificates = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(opts.CACertificates); err != nil {
		// The layer is what is under test, not the bundle.
		t.Logf("no CA bundle on this machine (Debian: apt-get install ca-certificates); the test ships a stand-in: %v", err)
		opts.CACertificates = filepath.Join(t.TempDir(), "ca-certificates.crt")
		if err := os.WriteFile(opts.CACertificates, []byte("# stand-in\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "pgtender-oci.tar")
	if err := WriteOCIArchive(img, archive, testVersion); err != nil {
		t.Fatal(err)
	}

	// Read the archive back: an OCI layout with one image named by the
	// version.
	layoutDir := t.TempDir()
	untar(t, archive, layoutDir)
	index, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatalf("the archive is not an OCI layout: %v", err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 {
		t.Fatalf("the layout holds %d manifests, want 1", len(manifest.Manifests))
	}
	desc := manifest.Manifests[0]
	if desc.MediaType != types.OCIManifestSchema1 || desc.Annotations[refNameAnnotation] != testVersion {
		t.Errorf("the layout's image is %s named %q, want %s named %q", desc.MediaType, desc.Annotations[refNameAnnotation], types.OCIManifestSchema1, testVersion)
	}
	read, err := index.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	file, err := read.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	configJSON, _ := json.MarshalIndent(file.Config, "", "  ")
	t.Logf("image %s (%s/%s, created %s), config as read from the archive:\n%s", desc.Digest, file.OS, file.Architecture, file.Created.Time.Format(time.RFC3339), configJSON)

	if file.OS != "linux" || file.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", file.OS, file.Architecture, runtime.GOARCH)
	}
	config := file.Config
	for _, check := range []struct {
		what      string
		got, want any
	}{
		{"User", config.User, "65532:65532"},
		{"Entrypoint", config.Entrypoint, []string{"/pgtender"}},
		{"Cmd", config.Cmd, []string{"--config", "/etc/pgtender/pgdog.toml", "--users", "/etc/pgtender/users.toml"}},
		{"StopSignal", config.StopSignal, "SIGTERM"},
		{"ExposedPorts", config.ExposedPorts, map[string]struct{}{"6432/tcp": {}, "9930/tcp": {}}},
		{"Healthcheck.Test", config.Healthcheck.Test, []string{"CMD", "/pgtender", "--healthcheck", "http://127.0.0.1:9930/healthz"}},
		{"Labels[version]", config.Labels["org.opencontainers.image.version"], testVersion},
		{"Labels[revision]", config.Labels["org.opencontainers.image.revision"], revision},
		{"Env", config.Env, []string(nil)},
	} {
		if !reflect.DeepEqual(check.got, check.want) {
			t.Errorf("config %s = %#v, want %#v", check.what, check.got, check.want)
		}
	}

	// One layer: exactly the files the Dockerfile copies, owned by root,
	// the binaries executable by all.
	layers, err := read.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	if mediaType, _ := layers[0].MediaType(); mediaType != types.OCILayer {
		t.Errorf("layer media type %s, want %s", mediaType, types.OCILayer)
	}
	rootfs := t.TempDir()
	entries := extractLayer(t, layers[0], rootfs)
	wantEntries := []string{
		"etc/ 755", "etc/ssl/ 755", "etc/ssl/certs/ 755", "etc/ssl/certs/ca-certificates.crt 644",
		"loginstorm 755", "pgtender 755",
	}
	if !slices.Equal(entries, wantEntries) {
		t.Errorf("layer entries %q, want %q", entries, wantEntries)
	}

	// The binary out of the image says what it is.
	pgtender := filepath.Join(rootfs, "pgtender")
	out, err := exec.CommandContext(ctx, pgtender, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("pgtender --version from the image: %v\n%s", err, out)
	}
	line := strings.TrimSpace(string(out))
	t.Logf("pgtender --version from the image: %s", line)
	goVersion := runtime.Version() + " linux/" + runtime.GOARCH
	prefix := "pgtender " + testVersion + " commit " + revision
	if line != prefix+" "+goVersion && line != prefix+" (modified) "+goVersion {
		t.Errorf("--version printed %q, want %q (or with (modified) after the commit)", line, prefix+" "+goVersion)
	}
	out, _ = exec.CommandContext(ctx, filepath.Join(rootfs, "loginstorm"), "-h").CombinedOutput()
	if !strings.Contains(string(out), "Usage of loginstorm") {
		t.Errorf("loginstorm -h from the image printed:\n%s", out)
	}

	runContainer(t, ctx, rootfs, config)
}

// runContainer runs the image's entrypoint roughly as a container runtime
// does, where the test is root: chrooted into the layer's files, as the
// image's numeric user, with a configuration where the runtime would mount
// it; then the image's HEALTHCHECK command passes, and the stop signal
// drains it and it exits 0. There is no network namespace: the HEALTHCHECK
// URL's port must be free on the machine.
func runContainer(t *testing.T, ctx context.Context, rootfs string, config v1.Config) {
	if os.Geteuid() != 0 {
		t.Log("not root: the image's entrypoint was not run chrooted as its user")
		return
	}
	healthPort := 9930
	if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(healthPort)); err != nil {
		t.Logf("port %d is taken on this machine (%v): the image's entrypoint was not run", healthPort, err)
		return
	} else {
		l.Close()
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	// Postgres need not run: pgtender serves (and /healthz answers) while
	// its database is unreachable.
	if err := os.MkdirAll(filepath.Join(rootfs, "etc/pgtender"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{
		"pgdog.toml": fmt.Sprintf("[general]\nhost = \"127.0.0.1\"\nport = %d\nopenmetrics_port = %d\nopenmetrics_host = \"127.0.0.1\"\nshutdown_timeout = 5000\n\n[[databases]]\nname = \"app\"\nhost = \"127.0.0.1\"\nport = 1\n", port, healthPort),
		"users.toml": "",
	} {
		if err := os.WriteFile(filepath.Join(rootfs, "etc/pgtender", name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// t.TempDir is 0700: the image's user must be able to enter its root.
	if err := os.Chmod(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := parseUser(t, config.User)
	container := func(args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = "/"
		cmd.Env = config.Env // none: a runtime passes the image's Env only
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Credential: &syscall.Credential{Uid: uid, Gid: gid}}
		return cmd
	}

	var output strings.Builder
	main := container(append(slices.Clone(config.Entrypoint), config.Cmd...)...)
	main.Stdout, main.Stderr = &output, &output
	if err := main.Start(); err != nil {
		t.Fatalf("start the entrypoint chrooted: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- main.Wait() }()
	defer func() {
		select {
		case <-exited:
		default:
			main.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("pgtender's output in the image:\n%s", output.String())
		}
	}()

	test := config.Healthcheck.Test
	if len(test) < 2 || test[0] != "CMD" {
		t.Fatalf("HEALTHCHECK %q is not the exec form", test)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := container(test[1:]...).CombinedOutput()
		if err == nil {
			t.Logf("HEALTHCHECK in the image: %s", strings.TrimSpace(string(out)))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("HEALTHCHECK %q never passed: %v\n%s", test[1:], err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if status, err := httpStatus(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", healthPort)); err != nil || status != 200 {
		t.Errorf("GET /healthz of the chrooted pgtender: %d %v", status, err)
	}

	stop, err := signalNumber(config.StopSignal)
	if err != nil {
		t.Fatal(err)
	}
	if err := main.Process.Signal(stop); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred check
		if err != nil {
			t.Fatalf("after %s the entrypoint exited with %v, want 0", config.StopSignal, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the entrypoint did not exit after %s", config.StopSignal)
	}
	if !strings.Contains(output.String(), "drained") {
		t.Errorf("no drain in the output after %s:\n%s", config.StopSignal, output.String())
	}
}

// TestDockerfileAgrees parses deploy/Dockerfile and checks that its final
// stage is what Build makes, and its build stage builds as BuildBinaries
// does: the Dockerfile says CI reproduces its steps, and this keeps it true.
func TestDockerfileAgrees(t *testing.T) {
	stages := parseDockerfile(t, filepath.Join(repo, "deploy/Dockerfile"))
	if len(stages) != 2 {
		t.Fatalf("%d stages, want 2 (build, final)", len(stages))
	}
	build, final := stages[0], stages[1]
	if from := final.one(t, "FROM"); from != "scratch" {
		t.Errorf("final stage FROM %s, want scratch (Build starts from an empty image)", from)
	}
	config := Config(Options{})

	if got := final.one(t, "USER"); got != config.User {
		t.Errorf("USER %s, image %s", got, config.User)
	}
	if got := final.one(t, "STOPSIGNAL"); got != config.StopSignal {
		t.Errorf("STOPSIGNAL %s, image %s", got, config.StopSignal)
	}
	var ports []string
	for _, port := range strings.Fields(final.one(t, "EXPOSE")) {
		if !strings.Contains(port, "/") {
			port += "/tcp"
		}
		ports = append(ports, port)
	}
	if want := slices.Sorted(mapKeys(config.ExposedPorts)); !slices.Equal(slices.Sorted(slices.Values(ports)), want) {
		t.Errorf("EXPOSE %q, image %q", ports, want)
	}
	if got := jsonArray(t, "ENTRYPOINT", final.one(t, "ENTRYPOINT")); !slices.Equal(got, config.Entrypoint) {
		t.Errorf("ENTRYPOINT %q, image %q", got, config.Entrypoint)
	}
	if got := jsonArray(t, "CMD", final.one(t, "CMD")); !slices.Equal(got, config.Cmd) {
		t.Errorf("CMD %q, image %q", got, config.Cmd)
	}

	// HEALTHCHECK [--option=duration ...] CMD [...]
	health := final.one(t, "HEALTHCHECK")
	rest := health
	got := v1.HealthConfig{}
	for strings.HasPrefix(rest, "--") {
		option, after, _ := strings.Cut(rest, " ")
		rest = strings.TrimSpace(after)
		name, value, _ := strings.Cut(strings.TrimPrefix(option, "--"), "=")
		if name == "retries" {
			got.Retries, _ = strconv.Atoi(value)
			continue
		}
		d, err := time.ParseDuration(value)
		if err != nil {
			t.Fatalf("HEALTHCHECK --%s=%s: %v", name, value, err)
		}
		switch name {
		case "interval":
			got.Interval = d
		case "timeout":
			got.Timeout = d
		case "start-period":
			got.StartPeriod = d
		default:
			t.Errorf("HEALTHCHECK --%s: not compared with the image", name)
		}
	}
	command, ok := strings.CutPrefix(rest, "CMD ")
	if !ok {
		t.Fatalf("HEALTHCHECK %q: want the exec form, CMD [...]", health)
	}
	got.Test = append([]string{"CMD"}, jsonArray(t, "HEALTHCHECK CMD", command)...)
	if !reflect.DeepEqual(got, *config.Healthcheck) {
		t.Errorf("HEALTHCHECK %+v, image %+v", got, *config.Healthcheck)
	}

	// The same files at the same paths, and the same labels.
	var copied []string
	for _, copyLine := range final.all("COPY") {
		fields := strings.Fields(copyLine)
		copied = append(copied, fields[len(fields)-1])
	}
	wantCopied := []string{caCertificatesPath, pgtenderPath, loginstormPath}
	if !slices.Equal(slices.Sorted(slices.Values(copied)), slices.Sorted(slices.Values(wantCopied))) {
		t.Errorf("the final stage copies to %q, the image's layer holds %q", copied, wantCopied)
	}
	var labels []string
	for _, label := range final.all("LABEL") {
		for _, field := range strings.Fields(label) {
			if key, _, ok := strings.Cut(field, "="); ok {
				labels = append(labels, key)
			}
		}
	}
	if want := slices.Sorted(mapKeys(config.Labels)); !slices.Equal(slices.Sorted(slices.Values(labels)), want) {
		t.Errorf("LABEL keys %q, image %q", labels, want)
	}

	// The build stage: the Go of go.mod, static, trimmed, both commands.
	goMod, err := os.ReadFile(filepath.Join(repo, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, line := range strings.Split(string(goMod), "\n") {
		if v, ok := strings.CutPrefix(line, "go "); ok {
			goVersion = strings.TrimSpace(v)
		}
	}
	if want := "GO_VERSION=" + goVersion; !slices.Contains(stages[0].preamble, want) {
		t.Errorf("ARG %s missing before the first FROM (go.mod says go %s); the builder image must match", want, goVersion)
	}
	if !strings.HasPrefix(build.one(t, "FROM"), "golang:${GO_VERSION}") {
		t.Errorf("build stage FROM %s, want golang:${GO_VERSION}...", build.one(t, "FROM"))
	}
	if !slices.Contains(build.all("ENV"), "CGO_ENABLED=0") {
		t.Errorf("the build stage does not set ENV CGO_ENABLED=0: %q", build.all("ENV"))
	}
	runs := strings.Join(build.all("RUN"), "\n")
	for _, want := range []string{"go build -trimpath", "./cmd/pgtender", "./cmd/loginstorm", "-X main.version="} {
		if !strings.Contains(runs, want) {
			t.Errorf("the build stage's RUN lines lack %q:\n%s", want, runs)
		}
	}
}

// stage is one FROM ... section of a Dockerfile: its instructions in
// order, upper-cased, with their arguments; preamble holds the ARGs before
// the first FROM (on the first stage only).
type stage struct {
	instructions [][2]string
	preamble     []string
}

func (s stage) all(instruction string) []string {
	var values []string
	for _, in := range s.instructions {
		if in[0] == instruction {
			values = append(values, in[1])
		}
	}
	return values
}

func (s stage) one(t *testing.T, instruction string) string {
	t.Helper()
	values := s.all(instruction)
	if len(values) != 1 {
		t.Fatalf("%s appears %d times in the stage, want once", instruction, len(values))
	}
	return values[0]
}

// parseDockerfile splits a Dockerfile into stages: comment lines are
// dropped, a trailing backslash joins lines
// (https://docs.docker.com/reference/dockerfile/#format).
func parseDockerfile(t *testing.T, file string) []stage {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var logical []string
	pending := ""
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && pending == "") {
			continue
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			pending += body + " "
			continue
		}
		logical = append(logical, strings.Join(strings.Fields(pending+trimmed), " "))
		pending = ""
	}
	var stages []stage
	var preamble []string
	for _, line := range logical {
		instruction, args, _ := strings.Cut(line, " ")
		instruction = strings.ToUpper(instruction)
		if instruction == "FROM" {
			stages = append(stages, stage{})
			if len(stages) == 1 {
				stages[0].preamble = preamble
			}
		}
		if len(stages) == 0 {
			if instruction != "ARG" {
				t.Fatalf("%s before the first FROM", instruction)
			}
			preamble = append(preamble, args)
			continue
		}
		if instruction == "FROM" {
			args = strings.Fields(args)[0] // without AS name
		}
		last := &stages[len(stages)-1]
		last.instructions = append(last.instructions, [2]string{instruction, args})
	}
	return stages
}

func jsonArray(t *testing.T, what, text string) []string {
	t.Helper()
	var values []string
	if err := json.Unmarshal([]byte(text), &values); err != nil {
		t.Fatalf("%s %s: want the exec (JSON array) form: %v", what, text, err)
	}
	return values
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// assertStatic fails unless binary is a statically linked ELF file: no
// program interpreter and no shared libraries, since the image has no
// libc.
func assertStatic(t *testing.T, binary string) {
	t.Helper()
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			t.Errorf("%s has a program interpreter: not static", binary)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q (%v): not static", binary, libs, err)
	}
}

// gitHead is the checkout's commit, which the binary's stamp must name.
func gitHead(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("git", "rev-parse", "HEAD")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// untar extracts the archive at file into dir; it refuses names that would
// leave dir.
func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		writeEntry(t, dir, h, tr)
	}
}

// extractLayer writes the layer's files under dir and returns its entries
// as "name mode", sorted.
func extractLayer(t *testing.T, layer v1.Layer, dir string) []string {
	t.Helper()
	rc, err := layer.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var entries []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		entries = append(entries, fmt.Sprintf("%s %o", h.Name, h.Mode&0o7777))
		writeEntry(t, dir, h, tr)
	}
	slices.Sort(entries)
	return entries
}

func writeEntry(t *testing.T, dir string, h *tar.Header, r io.Reader) {
	t.Helper()
	name := path.Clean(h.Name)
	if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		t.Fatalf("archive entry %q leaves the directory", h.Name)
	}
	target := filepath.Join(dir, filepath.FromSlash(name))
	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.MkdirAll(target, 0o755); err != nil {
			t.Fatal(err)
		}
	case tar.TypeReg:
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode&0o777))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, r); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("archive entry %q of type %c: only directories and files are expected", h.Name, h.Typeflag)
	}
}

func parseUser(t *testing.T, user string) (uint32, uint32) {
	t.Helper()
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("USER %q is not numeric uid:gid", user)
	}
	return uint32(uid), uint32(gid)
}

func signalNumber(name string) (syscall.Signal, error) {
	switch name {
	case "SIGTERM":
		return syscall.SIGTERM, nil
	case "SIGINT":
		return syscall.SIGINT, nil
	}
	return 0, fmt.Errorf("stop signal %q: not one pgtender drains on", name)
}

func httpStatus(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
