// Package testpg starts throwaway PostgreSQL clusters for tests: initdb into a
// fresh temporary directory, pg_ctl start on a free 127.0.0.1 port, and at the
// end pg_ctl stop and removal of the directory.
//
// The cluster is what the pooler meets in production, minus durability:
// SCRAM-SHA-256 for every TCP login (also the superuser's), trust only for the
// superuser over the private unix socket, fsync off, max_connections 200 and
// connection logging on, so tests can count logins and failed authentications
// in LogPath. When the test runs as root, every PostgreSQL program runs as the
// postgres OS user through runuser (initdb and postgres refuse root).
//
// Clusters left behind by a test process that died without running its
// cleanups (a -timeout panic, SIGKILL) are stopped and removed by the next
// process that calls Start.
package testpg

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Options tunes a cluster. The zero value is ready to use.
type Options struct {
	// Config holds extra postgresql.conf settings, name to value. They are
	// written after testpg's defaults, so they override them (for example
	// "max_connections": "20"). Values are written quoted, which PostgreSQL
	// accepts for settings of every type.
	Config map[string]string
	// TLSCertPEM and TLSKeyPEM, when both are set, turn ssl on with this
	// certificate and private key (PEM; see internal/testcert), written
	// into the data directory. TCP logins may then use TLS or not: the
	// pg_hba.conf lines are "host", which accept both.
	TLSCertPEM, TLSKeyPEM []byte
}

// ShutdownMode is pg_ctl's stop mode (-m).
type ShutdownMode string

const (
	// ShutdownSmart waits for every client to disconnect.
	ShutdownSmart ShutdownMode = "smart"
	// ShutdownFast terminates sessions (clients see SQLSTATE 57P01) and
	// shuts down cleanly.
	ShutdownFast ShutdownMode = "fast"
	// ShutdownImmediate kills the server processes without a clean shutdown,
	// as a crash would; the next start runs crash recovery.
	ShutdownImmediate ShutdownMode = "immediate"
)

// ErrStopped is returned by Up, Down and Restart after Stop.
var ErrStopped = errors.New("testpg: server stopped and removed")

// Server is one running cluster. Its methods are safe for concurrent use.
type Server struct {
	Host          string // always 127.0.0.1
	Port          int
	SuperUser     string // "postgres"
	SuperPassword string // random; SCRAM over TCP, not needed over SocketDir
	Dir           string // everything below is in here; Stop removes it
	DataDir       string
	SocketDir     string // unix_socket_directories
	LogPath       string // the server log (pg_ctl -l)

	binDir string
	owner  *osUser // non-nil when PostgreSQL programs run as another OS user

	mu      sync.Mutex // serialises Up, Down, Restart and Stop
	removed bool
}

// osUser is the account PostgreSQL programs run as when the test runs as root.
type osUser struct {
	name     string
	uid, gid int
	runuser  string // path of runuser(1)
}

const (
	dirPrefix      = "pgtender-testpg-"
	ownerFile      = "owner.pid" // the pid of the test process, for reapStale
	includedConf   = "testpg.conf"
	tlsCertFile    = "server.crt" // in DataDir, with Options.TLSCertPEM
	tlsKeyFile     = "server.key"
	initdbTimeout  = 2 * time.Minute
	pgctlTimeout   = 60 * time.Second // pg_ctl -t for start and stop
	connectTimeout = 10 * time.Second
	// A unix socket path must fit sun_path (108 bytes with the NUL).
	maxSocketPath = 107
)

// Start creates and starts a cluster. It returns once the server accepts
// SCRAM logins on Host:Port. On error nothing is left behind, and the error
// carries the end of the server log.
func Start(opts Options) (*Server, error) {
	if err := checkConfig(opts.Config); err != nil {
		return nil, err
	}
	if (opts.TLSCertPEM == nil) != (opts.TLSKeyPEM == nil) {
		return nil, errors.New("testpg: Options.TLSCertPEM and TLSKeyPEM go together")
	}
	binDir, err := BinDir()
	if err != nil {
		return nil, err
	}
	owner, err := serverOwner()
	if err != nil {
		return nil, err
	}
	reapOnce.Do(func() { reapStale(binDir, owner) })

	dir, err := os.MkdirTemp("", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("testpg: %w", err)
	}
	s := &Server{
		Host:      "127.0.0.1",
		SuperUser: "postgres",
		Dir:       dir,
		DataDir:   filepath.Join(dir, "data"),
		SocketDir: dir,
		LogPath:   filepath.Join(dir, "postgres.log"),
		binDir:    binDir,
		owner:     owner,
	}
	if err := s.create(opts); err != nil {
		if stopErr := s.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, err
	}
	return s, nil
}

// StartTB is Start for one test or benchmark: it fails tb on error and stops
// the cluster in tb.Cleanup, logging the end of the server log first if tb
// failed. Under -short it skips tb, so `go test -short` needs no PostgreSQL.
func StartTB(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("testpg: needs a real PostgreSQL; skipped in -short mode")
	}
	s, err := Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("testpg: end of %s:%s", s.LogPath, s.logTail())
		}
		if err := s.Stop(); err != nil {
			tb.Errorf("testpg: %v", err)
		}
	})
	return s
}

func (s *Server) create(opts Options) error {
	if err := os.WriteFile(filepath.Join(s.Dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		return fmt.Errorf("testpg: %w", err)
	}
	if s.owner != nil {
		if err := os.Chown(s.Dir, s.owner.uid, s.owner.gid); err != nil {
			return fmt.Errorf("testpg: %w", err)
		}
	}
	if n := len(filepath.Join(s.SocketDir, ".s.PGSQL.65535")); n > maxSocketPath {
		return fmt.Errorf("testpg: unix socket path under %s would be %d bytes, over the limit of %d; set TMPDIR to a shorter directory", s.SocketDir, n, maxSocketPath)
	}

	s.SuperPassword = randomHex(16)
	pwfile := filepath.Join(s.Dir, "superuser.password")
	if err := s.writeFile(pwfile, s.SuperPassword+"\n"); err != nil {
		return err
	}
	_, err := s.run(initdbTimeout, "initdb", "-D", s.DataDir, "-U", s.SuperUser, "--pwfile="+pwfile,
		"--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync")
	os.Remove(pwfile)
	if err != nil {
		if s.owner != nil {
			err = fmt.Errorf("%w (the %s user must be able to reach %s; if it cannot, set TMPDIR)", err, s.owner.name, s.Dir)
		}
		return fmt.Errorf("testpg: %w", err)
	}

	hba := fmt.Sprintf(`# Written by testpg: SCRAM for every TCP login, trust only for the superuser on the private socket.
# TYPE  DATABASE  USER      ADDRESS       METHOD
local   all       %[1]s                 trust
local   all       all                     scram-sha-256
host    all       all       127.0.0.1/32  scram-sha-256
host    all       all       ::1/128       scram-sha-256
`, s.SuperUser)
	if err := s.writeFile(filepath.Join(s.DataDir, "pg_hba.conf"), hba); err != nil {
		return err
	}
	conf, err := os.OpenFile(filepath.Join(s.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("testpg: %w", err)
	}
	_, err = fmt.Fprintf(conf, "\ninclude '%s'\n", includedConf)
	if closeErr := conf.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("testpg: %w", err)
	}

	settings := opts.Config
	if opts.TLSCertPEM != nil {
		settings = map[string]string{"ssl": "on", "ssl_cert_file": tlsCertFile, "ssl_key_file": tlsKeyFile}
		for name, value := range opts.Config {
			settings[name] = value
		}
		for name, content := range map[string][]byte{tlsCertFile: opts.TLSCertPEM, tlsKeyFile: opts.TLSKeyPEM} {
			if err := s.writeFile(filepath.Join(s.DataDir, name), string(content)); err != nil {
				return err
			}
		}
	}

	// The free port can be taken between our probe and the postmaster's bind;
	// when the log says so, try another one.
	const attempts = 3
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.Port = port
		if err := s.writeFile(filepath.Join(s.DataDir, includedConf), s.settings(settings)); err != nil {
			return err
		}
		logStart := fileSize(s.LogPath)
		err = s.Up()
		if err == nil {
			return nil
		}
		if attempt == attempts || !bytes.Contains(readFrom(s.LogPath, logStart), []byte("Address already in use")) {
			return err
		}
	}
}

// settings is the content of testpg.conf: testpg's defaults, then extra in
// name order (a later line wins in postgresql.conf).
func (s *Server) settings(extra map[string]string) string {
	var b strings.Builder
	b.WriteString("# Written by testpg; Options.Config comes last and wins.\n")
	line := func(name, value string) {
		fmt.Fprintf(&b, "%s = '%s'\n", name, strings.ReplaceAll(value, "'", "''"))
	}
	line("listen_addresses", s.Host)
	line("port", strconv.Itoa(s.Port))
	line("unix_socket_directories", s.SocketDir)
	line("max_connections", "200")
	line("shared_buffers", "16MB")
	line("fsync", "off")
	line("synchronous_commit", "off")
	line("full_page_writes", "off")
	line("password_encryption", "scram-sha-256")
	line("log_connections", "on")
	line("log_line_prefix", "%m [%p] %q%u@%d ")
	line("logging_collector", "off")
	line("ssl", "off")
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		line(name, extra[name])
	}
	return b.String()
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

func checkConfig(config map[string]string) error {
	for name, value := range config {
		if !settingName.MatchString(name) {
			return fmt.Errorf("testpg: Options.Config: %q is not a setting name", name)
		}
		if strings.ContainsAny(value, "\x00\r\n") {
			return fmt.Errorf("testpg: Options.Config: the value of %s contains a line break or NUL", name)
		}
	}
	return nil
}

// Up starts the postmaster of a cluster that Down stopped, on the same port,
// and returns once it accepts logins.
func (s *Server) Up() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return ErrStopped
	}
	return s.upLocked()
}

// Down stops the postmaster in the given mode and keeps the cluster, for
// fault tests: a pooler in front sees PostgreSQL go away until Up.
func (s *Server) Down(mode ShutdownMode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return ErrStopped
	}
	return s.downLocked(mode)
}

// Restart is Down(ShutdownFast) then Up: every session is terminated and the
// server comes back on the same port.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return ErrStopped
	}
	if err := s.downLocked(ShutdownFast); err != nil {
		return err
	}
	return s.upLocked()
}

// Stop stops the server (fast, falling back to immediate) if it runs, then
// removes Dir. It is idempotent: later calls return nil.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return nil
	}
	s.removed = true
	return s.destroyLocked(ShutdownFast)
}

// destroyLocked stops the postmaster if it runs and removes Dir. s.mu must be held.
func (s *Server) destroyLocked(mode ShutdownMode) error {
	var errs []error
	if s.runningLocked() {
		if err := s.downLocked(mode); err != nil {
			errs = append(errs, err)
			if mode != ShutdownImmediate && s.runningLocked() {
				if err := s.downLocked(ShutdownImmediate); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if err := os.RemoveAll(s.Dir); err != nil {
		errs = append(errs, fmt.Errorf("testpg: %w", err))
	}
	return errors.Join(errs...)
}

// upLocked starts the postmaster. s.mu must be held.
func (s *Server) upLocked() error {
	_, err := s.run(pgctlTimeout+30*time.Second, "pg_ctl", "start", "-D", s.DataDir, "-l", s.LogPath,
		"-w", "-t", strconv.Itoa(int(pgctlTimeout/time.Second)))
	if err != nil {
		return fmt.Errorf("testpg: %w; end of %s:%s", err, s.LogPath, s.logTail())
	}
	// pg_ctl -w saw the postmaster ready; check the door tests will use.
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	conn, err := s.connect(ctx, "postgres")
	if err != nil {
		return fmt.Errorf("testpg: started, but no login on %s:%d: %w; end of %s:%s", s.Host, s.Port, err, s.LogPath, s.logTail())
	}
	return conn.Close(ctx)
}

// downLocked stops the postmaster. s.mu must be held.
func (s *Server) downLocked(mode ShutdownMode) error {
	_, err := s.run(pgctlTimeout+30*time.Second, "pg_ctl", "stop", "-D", s.DataDir, "-m", string(mode),
		"-w", "-t", strconv.Itoa(int(pgctlTimeout/time.Second)))
	if err != nil {
		return fmt.Errorf("testpg: %w", err)
	}
	return nil
}

// runningLocked reports whether pg_ctl status finds a live postmaster. s.mu must be held.
func (s *Server) runningLocked() bool {
	if _, err := os.Stat(filepath.Join(s.DataDir, "postmaster.pid")); err != nil {
		return false
	}
	_, err := s.run(pgctlTimeout, "pg_ctl", "status", "-D", s.DataDir)
	return err == nil
}

// ConnString returns a postgres:// URL for user on Host:Port with
// sslmode=disable; an empty password is left out.
func (s *Server) ConnString(user, password, database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     net.JoinHostPort(s.Host, strconv.Itoa(s.Port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	if password != "" {
		u.User = url.UserPassword(user, password)
	}
	return u.String()
}

// CountLogLines counts the server log lines that contain substr, for example
// `password authentication failed for user "app"` or `connection authorized: user=app`.
func (s *Server) CountLogLines(substr string) (int, error) {
	data, err := os.ReadFile(s.LogPath)
	if err != nil {
		return 0, fmt.Errorf("testpg: %w", err)
	}
	n := 0
	for line := range bytes.Lines(data) {
		if bytes.Contains(line, []byte(substr)) {
			n++
		}
	}
	return n, nil
}

// run runs one of the PostgreSQL programs, as s.owner when set, in Dir, with
// a timeout. The error carries the program's output.
func (s *Server) run(timeout time.Duration, program string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := pgCommand(ctx, s.binDir, s.owner, program, args...)
	cmd.Dir = s.Dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		label := program
		if program == "pg_ctl" {
			label += " " + args[0]
		}
		return string(out), fmt.Errorf("%s: %w: %s", label, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// pgCommand builds the command for a PostgreSQL program, through runuser when
// owner is set. PG* variables are dropped so that PGDATA or PGPORT from the
// caller's shell cannot redirect it, and LC_ALL=C keeps messages in English
// for the log checks.
func pgCommand(ctx context.Context, binDir string, owner *osUser, program string, args ...string) *exec.Cmd {
	path := filepath.Join(binDir, program)
	var cmd *exec.Cmd
	if owner != nil {
		cmd = exec.CommandContext(ctx, owner.runuser, append([]string{"-u", owner.name, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	env := []string{"LC_ALL=C"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && !strings.HasPrefix(kv, "LC_ALL=") {
			env = append(env, kv)
		}
	}
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// writeFile writes a private file that the PostgreSQL programs can read.
func (s *Server) writeFile(path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("testpg: %w", err)
	}
	if s.owner != nil {
		if err := os.Chown(path, s.owner.uid, s.owner.gid); err != nil {
			return fmt.Errorf("testpg: %w", err)
		}
	}
	return nil
}

// logTail returns the last 30 lines of the server log, each indented on its
// own line, for error messages.
func (s *Server) logTail() string {
	const lines = 30
	data, err := os.ReadFile(s.LogPath)
	if err != nil {
		return " (no log: " + err.Error() + ")"
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "\n\t" + strings.Join(all, "\n\t")
}

// serverOwner returns the postgres OS user when the process runs as root,
// since initdb and postgres refuse to run as root, and nil otherwise.
func serverOwner() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("testpg: running as root needs the postgres OS user to run PostgreSQL as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		for _, p := range []string{"/usr/sbin/runuser", "/sbin/runuser"} {
			if _, statErr := os.Stat(p); statErr == nil {
				runuser, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("testpg: running as root needs runuser (util-linux): %w", err)
	}
	return &osUser{name: u.Username, uid: uid, gid: gid, runuser: runuser}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testpg: finding a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

func fileSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Size()
}

// readFrom returns the content of path from offset on, or nil.
func readFrom(path string, offset int64) []byte {
	data, err := os.ReadFile(path)
	if err != nil || offset > int64(len(data)) {
		return nil
	}
	return data[offset:]
}
