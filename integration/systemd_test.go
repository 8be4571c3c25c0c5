package integration

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgtender/pgtender/config"
	"github.com/pgtender/pgtender/internal/sdnotify"
)

// notification is one datagram pgtender sent to the notify socket.
type notification struct {
	state string
	pid   int32 // the sender, from SCM_CREDENTIALS
}

// notifySocket is a $NOTIFY_SOCKET as systemd opens it: a datagram socket
// with SO_PASSCRED, so each datagram carries its sender's pid (systemd's
// NotifyAccess=main, the default for Type=notify, drops datagrams from any
// other process).
type notifySocket struct {
	path   string
	conn   *net.UnixConn
	states chan notification
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil || sockErr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, sockErr)
	}
	ns := &notifySocket{path: path, conn: conn, states: make(chan notification, 16)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf, oob := make([]byte, 4096), make([]byte, 256)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return // closed at the end of the test
			}
			got := notification{state: string(buf[:n]), pid: -1}
			if messages, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, m := range messages {
					if cred, err := unix.ParseUnixCredentials(&m); err == nil {
						got.pid = cred.Pid
					}
				}
			}
			ns.states <- got
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return ns
}

// next returns the next notification, failing the test if none comes.
func (ns *notifySocket) next(t *testing.T, what string) notification {
	t.Helper()
	select {
	case n := <-ns.states:
		return n
	case <-time.After(15 * time.Second):
		t.Fatalf("no notification %s", what)
		return notification{}
	}
}

// TestSystemdNotify runs the pgtender binary as systemd runs a Type=notify
// unit, with $NOTIFY_SOCKET pointing at a socket the test listens on, and
// checks the protocol (sd_notify(3)): READY=1 once the port accepts logins,
// RELOADING=1 with MONOTONIC_USEC and then READY=1 around a SIGHUP reload,
// STOPPING=1 when SIGTERM begins the drain and nothing after, every datagram
// from pgtender's own pid.
func TestSystemdNotify(t *testing.T) {
	ns := listenNotify(t)
	dir := t.TempDir()
	port := freePort(t)
	configPath := filepath.Join(dir, "pgdog.toml")
	writeFile(t, configPath, processConfig(port, "shutdown_timeout = 20000", "pool_size = 2"))
	usersPath := filepath.Join(dir, "users.toml")
	writeFile(t, usersPath, "")

	cmd := exec.Command(pgtenderBinary(t), "--config", configPath, "--users", usersPath)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+ns.path)
	output, exited := startChild(t, cmd)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtender output:\n%s", output.String())
		}
	})
	pid := int32(cmd.Process.Pid)
	pr := &process{addr: "127.0.0.1:" + strconv.Itoa(port)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// READY=1 comes first, and when it does a client can log in at once.
	ready := ns.next(t, "READY=1 at startup")
	if ready.state != sdnotify.Ready || ready.pid != pid {
		t.Fatalf("first notification %q from pid %d, want READY=1 from %d", ready.state, ready.pid, pid)
	}
	conn, err := pr.connect(ctx)
	if err != nil {
		t.Fatalf("login right after READY=1: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}

	// A reload: RELOADING=1 stamped with CLOCK_MONOTONIC between the
	// signal and its arrival, then READY=1 once the new file is applied.
	writeFile(t, configPath, processConfig(port, "shutdown_timeout = 20000", "pool_size = 3"))
	before, err := sdnotify.Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloading := ns.next(t, "RELOADING=1 after SIGHUP")
	after, _ := sdnotify.Monotonic()
	lines := strings.Split(reloading.state, "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") || reloading.pid != pid {
		t.Fatalf("after SIGHUP got %q from pid %d, want RELOADING=1 and MONOTONIC_USEC from %d", reloading.state, reloading.pid, pid)
	}
	usec, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || usec < before.Microseconds() || usec > after.Microseconds() {
		t.Errorf("MONOTONIC_USEC=%d (%v), want between %d and %d", usec, err, before.Microseconds(), after.Microseconds())
	}
	if ready := ns.next(t, "READY=1 after the reload"); ready.state != sdnotify.Ready || ready.pid != pid {
		t.Fatalf("after RELOADING=1 got %q from pid %d, want READY=1", ready.state, ready.pid)
	}
	// pgtender logs the reload before it sends READY=1, but the log comes
	// through a pipe and a copying goroutine, and may reach the buffer a
	// little after the datagram.
	eventually(t, 5*time.Second, "the reload's log line", func() bool {
		return strings.Contains(output.String(), "configuration reloaded")
	})

	// SIGTERM: STOPPING=1 while the drain waits for the transaction; a
	// SIGHUP during the drain still reloads but tells systemd nothing.
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if stopping := ns.next(t, "STOPPING=1 after SIGTERM"); stopping.state != sdnotify.Stopping || stopping.pid != pid {
		t.Fatalf("after SIGTERM got %q from pid %d, want STOPPING=1", stopping.state, stopping.pid)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatalf("COMMIT during the drain: %v", err)
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatal("pgtender did not exit after the drain")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after the drain, want 0", code)
	}
	select {
	case n := <-ns.states:
		t.Fatalf("notification %q after STOPPING=1", n.state)
	default:
	}
	if strings.Contains(output.String(), "cannot notify systemd") {
		t.Errorf("pgtender logged a notify failure:\n%s", output.String())
	}
}

// TestSystemdNotifySocketGone: a $NOTIFY_SOCKET nobody listens on (a unit
// of the wrong type, a manager gone) is logged once and pgtender serves on.
func TestSystemdNotifySocketGone(t *testing.T) {
	dir := t.TempDir()
	port := freePort(t)
	configPath := filepath.Join(dir, "pgdog.toml")
	writeFile(t, configPath, processConfig(port, "", ""))
	usersPath := filepath.Join(dir, "users.toml")
	writeFile(t, usersPath, "")
	cmd := exec.Command(pgtenderBinary(t), "--config", configPath, "--users", usersPath)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "nobody-listens"))
	output, _ := startChild(t, cmd)
	eventually(t, 10*time.Second, "pgtender to start", func() bool { return strings.Contains(output.String(), "pgtender started") })
	for i := 0; i < 2; i++ {
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "the reload", func() bool {
			return strings.Count(output.String(), "configuration reloaded") == i+1
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := (&process{addr: "127.0.0.1:" + strconv.Itoa(port)}).connect(ctx)
	if err != nil {
		t.Fatalf("login with a dead notify socket: %v", err)
	}
	conn.Close(ctx)
	if n := strings.Count(output.String(), "cannot notify systemd"); n != 1 {
		t.Fatalf("%d notify failures logged, want 1:\n%s", n, output.String())
	}
}

// unitPath is the systemd unit shipped in deploy/.
const unitPath = "../deploy/systemd/pgtender.service"

// unitInstalledBinary is where the unit expects pgtender.
const unitInstalledBinary = "/usr/local/bin/pgtender"

// parseUnit reads a systemd unit file (systemd.syntax(7)): [Section]
// headers, Key=Value lines, '#' and ';' comments; a key set twice keeps
// both values in order. Line continuations are not used in the unit and
// not supported here.
func parseUnit(t *testing.T, text string) map[string]map[string][]string {
	t.Helper()
	unit := map[string]map[string][]string{}
	section := ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			unit[section] = map[string][]string{}
		case section == "" || !strings.Contains(line, "=") || strings.HasSuffix(line, `\`):
			t.Fatalf("%s:%d: cannot parse %q", unitPath, i+1, line)
		default:
			key, value, _ := strings.Cut(line, "=")
			key, value = strings.TrimSpace(key), strings.TrimSpace(value)
			unit[section][key] = append(unit[section][key], value)
		}
	}
	return unit
}

// TestSystemdUnit checks deploy/systemd/pgtender.service: the keys the
// pooler's behaviour depends on (the notify protocol, SIGHUP for reload,
// SIGTERM with time to drain, descriptors, hardening), that its command
// lines are ones pgtender accepts, and, where systemd-analyze is installed,
// that systemd itself finds nothing wrong with it and rates its exposure
// OK.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	unit := parseUnit(t, string(data))
	service := unit["Service"]
	one := func(key string) string {
		t.Helper()
		if len(service[key]) != 1 {
			t.Fatalf("[Service] %s set %d times, want once: %q", key, len(service[key]), service[key])
		}
		return service[key][0]
	}
	for key, want := range map[string]string{
		"Type":                    "notify",
		"KillSignal":              "SIGTERM",
		"DynamicUser":             "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"NoNewPrivileges":         "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
	} {
		if got := one(key); got != want {
			t.Errorf("[Service] %s=%s, want %s", key, got, want)
		}
	}
	if got := service["ExecReload"]; len(got) == 0 || got[len(got)-1] != "/bin/kill -HUP $MAINPID" {
		t.Errorf("ExecReload=%q: the last must send SIGHUP to $MAINPID", got)
	}
	// systemd sends SIGKILL once TimeoutStopSec has passed: the drain
	// (shutdown_readiness_delay, then shutdown_timeout) must fit before.
	stop, err := time.ParseDuration(one("TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec: %v", err)
	}
	defaults := config.Defaults().General
	if drain := defaults.ShutdownReadinessDelay.Duration() + defaults.ShutdownTimeout.Duration(); stop <= drain {
		t.Errorf("TimeoutStopSec=%v, not above the default drain of %v", stop, drain)
	}
	if files, err := strconv.Atoi(one("LimitNOFILE")); err != nil || files < 65536 {
		t.Errorf("LimitNOFILE=%s, want a number of at least 65536", one("LimitNOFILE"))
	}
	if len(unit["Install"]["WantedBy"]) == 0 {
		t.Error("no [Install] WantedBy=: systemctl enable would not start it at boot")
	}

	// Both command lines run pgtender on the files in /etc/pgtender; the
	// reload's check, run here on copies, passes.
	start := strings.Fields(one("ExecStart"))
	if start[0] != unitInstalledBinary || strings.Join(start[1:], " ") != "--config /etc/pgtender/pgdog.toml --users /etc/pgtender/users.toml" {
		t.Errorf("ExecStart=%s", one("ExecStart"))
	}
	check := strings.Fields(service["ExecReload"][0])
	if check[0] != unitInstalledBinary || strings.Join(check[1:], " ") != "--check-config "+strings.Join(start[1:], " ") {
		t.Errorf("the first ExecReload= is %q, want ExecStart's arguments after --check-config", service["ExecReload"][0])
	}
	etc := t.TempDir()
	writeFile(t, filepath.Join(etc, "pgdog.toml"), processConfig(freePort(t), "", ""))
	writeFile(t, filepath.Join(etc, "users.toml"), "")
	args := strings.Fields(strings.ReplaceAll(strings.Join(check[1:], " "), "/etc/pgtender", etc))
	if out, err := exec.Command(pgtenderBinary(t), args...).CombinedOutput(); err != nil {
		t.Errorf("ExecReload's check on valid files: %v\n%s", err, out)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed (Debian: apt-get install systemd): the unit was checked by key only")
		return
	}
	// verify checks every key and that the binaries exist and are
	// executable: the unit is written with the test's binary in place
	// of /usr/local/bin/pgtender. It prints a line per problem and may
	// still exit 0, so any output fails.
	installed := filepath.Join(t.TempDir(), "pgtender.service")
	writeFile(t, installed, strings.ReplaceAll(string(data), unitInstalledBinary, pgtenderBinary(t)))
	out, err := exec.Command(analyze, "verify", installed).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// security --offline rates the sandboxing from the file alone.
	// --threshold is on its internal scale, ten times the exposure it
	// prints: 20 is an exposure of 2.0, within what it calls OK.
	out, err = exec.Command(analyze, "security", "--offline=yes", "--threshold=20", installed).CombinedOutput()
	summary := strings.TrimSpace(string(out))
	if i := strings.LastIndex(summary, "\n"); i >= 0 {
		summary = summary[i+1:]
	}
	if err != nil {
		t.Errorf("systemd-analyze security: %v, %s\n%s", err, summary, out)
	}
	t.Logf("systemd-analyze verify: no problems; security: %s", summary)
}
