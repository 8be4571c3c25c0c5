package integration

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgtender/pgtender/internal/testcert"
	"github.com/pgtender/pgtender/internal/testpg"
	"github.com/pgtender/pgtender/metrics"
)

// TLS: clients to pgtender (pgx, psql), certificate reload, passthrough
// modes that need TLS, and tls_verify against a Postgres with ssl on.

// testCA signs every certificate of this package's TLS tests: pgtender's
// and the ssl cluster's.
var (
	testCAOnce sync.Once
	testCA     *testcert.CA
)

func sharedCA(t testing.TB) *testcert.CA {
	testCAOnce.Do(func() { testCA = testcert.NewCA(t) })
	if testCA == nil {
		t.Fatal("no test CA")
	}
	return testCA
}

// The ssl cluster: started by the first test that needs it, stopped by
// TestMain. Its certificate names "localhost" only, so that 127.0.0.1 is a
// host name it does not match.
var (
	sslPGOnce sync.Once
	sslPG     *testpg.Server
	sslPGErr  error
)

func sslPostgres(t *testing.T) *testpg.Server {
	t.Helper()
	ca := sharedCA(t)
	sslPGOnce.Do(func() {
		leaf := ca.Issue(t, "localhost")
		sslPG, sslPGErr = testpg.Start(testpg.Options{TLSCertPEM: leaf.CertPEM, TLSKeyPEM: leaf.KeyPEM})
		if sslPGErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if sslPGErr = sslPG.CreateRole(ctx, appUser, appPassword); sslPGErr == nil {
			sslPGErr = sslPG.CreateDatabase(ctx, appDB, appUser)
		}
	})
	if sslPGErr != nil {
		t.Fatalf("ssl cluster: %v", sslPGErr)
	}
	return sslPG
}

func stopSSLPostgres() {
	if sslPG != nil {
		sslPG.Stop()
	}
}

// poolerCert writes a certificate for 127.0.0.1 and localhost, signed by
// the test CA, into dir and returns the [general] lines that use it.
func poolerCert(t *testing.T, dir string) (*testcert.Leaf, string) {
	t.Helper()
	leaf := sharedCA(t).Issue(t, "127.0.0.1", "localhost")
	certFile, keyFile := leaf.WriteFiles(t, dir)
	return leaf, fmt.Sprintf("tls_certificate = %q\ntls_private_key = %q", certFile, keyFile)
}

// scramUser is users.toml with the app user, for configured-user logins.
var scramUser = joinLines(`[[users]]`, `name = "`+appUser+`"`, `database = "`+appDB+`"`, `password = "`+appPassword+`"`)

// connectSSL logs in through addr with sslmode and returns the connection
// and the serial of the certificate pgtender showed (nil without TLS).
func connectSSL(ctx context.Context, addr, password, sslmode string) (*pgx.Conn, *big.Int, error) {
	cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=%s&connect_timeout=10", appUser, password, addr, appDB, sslmode))
	if err != nil {
		return nil, nil, err
	}
	if cc.TLSConfig != nil {
		cc.TLSConfig.RootCAs = testCA.Pool()
	}
	cc.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, nil, err
	}
	var serial *big.Int
	if tlsConn, ok := conn.PgConn().Conn().(*tls.Conn); ok {
		serial = tlsConn.ConnectionState().PeerCertificates[0].SerialNumber
	}
	return conn, serial, nil
}

// startTLSPooler starts a pooler with client TLS, the app user in
// users.toml (SCRAM) and a Prometheus login recorder; extra are more
// [general] lines.
func startTLSPooler(t *testing.T, extra string) (*testPooler, *metrics.LoginRecorder, *testcert.Leaf) {
	t.Helper()
	leaf, tlsLines := poolerCert(t, t.TempDir())
	recorder := metrics.NewLoginRecorder("")
	tp := startPooler(t, poolerOptions{recorder: recorder, general: joinLines(tlsLines, `auth_type = "scram"`, extra), users: scramUser})
	return tp, recorder, leaf
}

// loginCount reads logins_total{result} from a Prometheus login recorder.
func loginCount(t testing.TB, recorder *metrics.LoginRecorder, result string) float64 {
	t.Helper()
	registry := prometheus.NewRegistry()
	registry.MustRegister(recorder)
	gathered, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	families := map[string]*dto.MetricFamily{}
	for _, f := range gathered {
		families[f.GetName()] = f
	}
	return mustSample(t, families, "logins_total", map[string]string{"result": result})
}

// psqlPath finds psql as the pgbench test finds pgbench, then next to the
// server binaries.
func psqlPath(t *testing.T) string {
	t.Helper()
	if path, err := exec.LookPath("psql"); err == nil {
		return path
	}
	if dir, err := testpg.BinDir(); err == nil {
		if path := filepath.Join(dir, "psql"); fileExists(path) {
			return path
		}
	}
	t.Fatal("psql not found (.ci/run installs postgresql-client)")
	return ""
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestTLSClients: pgx with sslmode=require and verify-full, and psql with
// sslmode=require, log in over TLS; sslmode=disable works while TLS is not
// required; a garbled handshake is closed and counted without disturbing a
// client in a transaction.
func TestTLSClients(t *testing.T) {
	tp, recorder, leaf := startTLSPooler(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, sslmode := range []string{"require", "verify-full", "disable"} {
		conn, serial, err := connectSSL(ctx, tp.addr, appPassword, sslmode)
		if err != nil {
			t.Fatalf("pgx sslmode=%s: %v", sslmode, err)
		}
		switch {
		case sslmode == "disable" && serial != nil:
			t.Errorf("sslmode=disable used TLS")
		case sslmode != "disable" && (serial == nil || serial.Cmp(leaf.Cert.SerialNumber) != 0):
			t.Errorf("pgx sslmode=%s: served serial %v, want %v", sslmode, serial, leaf.Cert.SerialNumber)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Fatalf("sslmode=%s: SELECT 1 = %d, %v", sslmode, one, err)
		}
		conn.Close(ctx)
	}

	host, port := splitAddr(t, tp.addr)
	caFile := testCA.WriteFile(t, t.TempDir())
	for _, sslmode := range []string{"require", "verify-full"} {
		cmd := exec.CommandContext(ctx, psqlPath(t), "-X", "-At",
			"-c", `\conninfo`, "-c", "SELECT 'through pgtender'",
			fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=%s sslrootcert=%s", host, port, appUser, appDB, sslmode, caFile))
		cmd.Env = append(os.Environ(), "PGPASSWORD="+appPassword)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("psql sslmode=%s: %v\n%s", sslmode, err, out)
		}
		if !strings.Contains(string(out), "SSL connection") || !strings.Contains(string(out), "through pgtender") {
			t.Errorf("psql sslmode=%s did not report an SSL connection and the row:\n%s", sslmode, out)
		}
	}

	// A client in a transaction, while another connection garbles its
	// handshake.
	bystander, _, err := connectSSL(ctx, tp.addr, appPassword, "verify-full")
	if err != nil {
		t.Fatal(err)
	}
	defer bystander.Close(ctx)
	tx, err := bystander.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errorsBefore := loginCount(t, recorder, "error")
	raw, err := net.DialTimeout("tcp", tp.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write([]byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}); err != nil { // SSLRequest
		t.Fatal(err)
	}
	_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	var answer [1]byte
	if _, err := io.ReadFull(raw, answer[:]); err != nil || answer[0] != 'S' {
		t.Fatalf("SSLRequest answered %q, %v; want 'S'", answer[:], err)
	}
	// One whole TLS record, so that nothing is left unread when pgtender
	// closes (which would turn its FIN into a reset): a handshake message
	// of a type that does not exist.
	if _, err := raw.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x04, 0xff, 0x00, 0x00, 0x00}); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(raw); err != nil {
		t.Fatalf("the garbled handshake was not closed: %v", err)
	}
	eventually(t, 10*time.Second, "the garbled handshake to be counted as an error", func() bool {
		return loginCount(t, recorder, "error") == errorsBefore+1
	})
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("the bystander's transaction noticed: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the bystander's commit: %v", err)
	}
}

// TestTLSClientRequired: with tls_client_required, TLS clients log in and
// a plaintext one is refused with FATAL 28000 "SSL required", counted as
// rejected.
func TestTLSClientRequired(t *testing.T) {
	tp, recorder, _ := startTLSPooler(t, "tls_client_required = true")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, sslmode := range []string{"require", "verify-full"} {
		conn, _, err := connectSSL(ctx, tp.addr, appPassword, sslmode)
		if err != nil {
			t.Fatalf("sslmode=%s: %v", sslmode, err)
		}
		conn.Close(ctx)
	}
	_, _, err := connectSSL(ctx, tp.addr, appPassword, "disable")
	if sqlState(err) != "28000" || !strings.Contains(err.Error(), "SSL required") {
		t.Fatalf("sslmode=disable: %v, want FATAL 28000 SSL required", err)
	}
	// The refusal is counted as the session ends, which can be after the
	// client has read its FATAL.
	eventually(t, 10*time.Second, "the refusal to be counted as rejected", func() bool {
		return loginCount(t, recorder, "rejected") == 1
	})
	if got := loginCount(t, recorder, "auth_failed"); got != 0 {
		t.Errorf("logins_total{result=auth_failed} = %v, want 0", got)
	}
}

// TestTLSReloadCertificate: SIGHUP after the certificate files were
// replaced serves the new certificate to new clients; a key that does not
// load fails the reload, and the certificate in use stays.
func TestTLSReloadCertificate(t *testing.T) {
	dir := t.TempDir()
	first, tlsLines := poolerCert(t, dir)
	pr := startProcessWith(t, processOptions{general: tlsLines})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	servedSerial := func() *big.Int {
		conn, serial, err := connectSSL(ctx, pr.addr, appPassword, "verify-full")
		if err != nil {
			t.Fatalf("verify-full: %v", err)
		}
		conn.Close(ctx)
		return serial
	}
	if got := servedSerial(); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want %v", got, first.Cert.SerialNumber)
	}

	renewed := sharedCA(t).Issue(t, "127.0.0.1", "localhost")
	renewed.WriteFiles(t, dir)
	if err := pr.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a new client to be shown the renewed certificate", func() bool {
		return servedSerial().Cmp(renewed.Cert.SerialNumber) == 0
	})

	writeFile(t, filepath.Join(dir, "server.key"), "not a key\n")
	if err := pr.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the failed reload to be logged", func() bool {
		return strings.Contains(pr.output.String(), "reload failed; keeping the running configuration") &&
			strings.Contains(pr.output.String(), "tls_private_key")
	})
	if got := servedSerial(); got.Cmp(renewed.Cert.SerialNumber) != 0 {
		t.Errorf("after a failed reload: served serial %v, want %v still", got, renewed.Cert.SerialNumber)
	}
}

// TestTLSPassthroughModes: "enabled" and "enabled_allow_change" log TLS
// clients in through Postgres; a plaintext client is refused with 28000
// before pgtender asks for its password; without a certificate,
// --check-config reports the key at its line and the pooler does not start.
func TestTLSPassthroughModes(t *testing.T) {
	for _, mode := range []string{"enabled", "enabled_allow_change"} {
		t.Run(mode, func(t *testing.T) {
			_, tlsLines := poolerCert(t, t.TempDir())
			tp := startPooler(t, poolerOptions{general: tlsLines + "\npassthrough_auth = \"" + mode + "\""})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for _, sslmode := range []string{"require", "verify-full"} {
				conn, serial, err := connectSSL(ctx, tp.addr, appPassword, sslmode)
				if err != nil || serial == nil {
					t.Fatalf("sslmode=%s: %v (TLS: %v)", sslmode, err, serial != nil)
				}
				var user string
				if err := conn.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil || user != appUser {
					t.Fatalf("current_user = %q, %v", user, err)
				}
				conn.Close(ctx)
			}

			// A plaintext client: the first answer to its StartupMessage is
			// the refusal, not a request for its password.
			raw := rawStartup(t, tp.addr, appUser, appDB)
			defer raw.Close()
			_ = raw.SetReadDeadline(time.Now().Add(10 * time.Second))
			reply, err := io.ReadAll(raw)
			if err != nil {
				t.Fatalf("reading the reply: %v", err)
			}
			if len(reply) == 0 || reply[0] != 'E' || !strings.Contains(string(reply), "C28000\x00") || !strings.Contains(string(reply), "SSL required") {
				t.Fatalf("reply to a plaintext StartupMessage %q, want only ErrorResponse 28000 SSL required", reply)
			}
			if _, _, err := connectSSL(ctx, tp.addr, appPassword, "disable"); sqlState(err) != "28000" {
				t.Fatalf("pgx sslmode=disable: %v, want SQLSTATE 28000", err)
			}
		})
	}

	bin := pgtenderBinary(t)
	dir := t.TempDir()
	configPath := filepath.Join(dir, "pgdog.toml")
	writeFile(t, configPath, processConfig(freePort(t), `passthrough_auth = "enabled"`, ""))
	const want = `general.passthrough_auth: "enabled" needs client TLS (clients send cleartext passwords): set tls_certificate and tls_private_key, or use "enabled_plain"`
	out, err := exec.Command(bin, "--check-config", "--config", configPath).CombinedOutput()
	if exitCode(err) != 1 || !strings.Contains(string(out), "pgdog.toml:7: "+want) {
		t.Fatalf("--check-config: exit %d\n%s\nwant exit 1 and pgdog.toml:7: %s", exitCode(err), out, want)
	}
	out, err = exec.Command(bin, "--config", configPath).CombinedOutput()
	if exitCode(err) != 1 || !strings.Contains(string(out), want) {
		t.Fatalf("start without a certificate: exit %d\n%s", exitCode(err), out)
	}
}

// TestTLSVerifyModes runs pgtender's server connections against the ssl
// cluster, whose certificate names "localhost" only, in each tls_verify
// mode. pg_stat_ssl, queried through the pooler, tells whether the server
// connection uses TLS.
func TestTLSVerifyModes(t *testing.T) {
	server := sslPostgres(t)
	caFile := testCA.WriteFile(t, t.TempDir())
	ca := fmt.Sprintf("tls_server_ca_certificate = %q", caFile)
	for _, tc := range []struct {
		name    string
		general string
		host    string // "": 127.0.0.1
		ssl     bool   // the server connection uses TLS
		failure string // in the pooler's log when the server connection must fail
	}{
		{name: "disabled", general: `tls_verify = "disabled"`, ssl: false},
		{name: "prefer", general: `tls_verify = "prefer"`, ssl: true},
		{name: "verify_ca with the CA, any host name", general: `tls_verify = "verify_ca"` + "\n" + ca, ssl: true},
		{name: "verify_ca without the CA", general: `tls_verify = "verify_ca"`,
			failure: "certificate signed by unknown authority"},
		{name: "verify_full with the CA, matching host", general: `tls_verify = "verify_full"` + "\n" + ca, host: "localhost", ssl: true},
		{name: "verify_full with the CA, other host", general: `tls_verify = "verify_full"` + "\n" + ca,
			failure: "certificate is not valid for host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := startPooler(t, poolerOptions{server: server, host: tc.host,
				general: tc.general + "\nauth_type = \"scram\"\nconnect_timeout = 5000", users: scramUser})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
			if tc.failure != "" {
				if err == nil {
					conn.Close(ctx)
					t.Fatal("login succeeded; the server connection should have failed its certificate check")
				}
				if sqlState(err) != "08006" {
					t.Errorf("login: %v, want SQLSTATE 08006", err)
				}
				eventually(t, 10*time.Second, "the pooler to log "+tc.failure, func() bool {
					return strings.Contains(tp.logs.String(), tc.failure) && strings.Contains(tp.logs.String(), "tls_verify")
				})
				return
			}
			if err != nil {
				t.Fatalf("login: %v", err)
			}
			defer conn.Close(ctx)
			var ssl bool
			if err := conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl); err != nil {
				t.Fatal(err)
			}
			if ssl != tc.ssl {
				t.Errorf("server connection ssl = %v, want %v", ssl, tc.ssl)
			}
		})
	}
}

// An idle server connection over TLS that Postgres ended is noticed at
// checkout, as a plain one is (TestServerConnectionDies): the socket under
// the TLS layer shows the close, and the client never sees the failure.
func TestTLSIdleServerConnectionThatDiedIsNotHandedOut(t *testing.T) {
	server := sslPostgres(t)
	tp := startPooler(t, poolerOptions{server: server, pool: "pool_size = 1",
		general: "tls_verify = \"prefer\"\nauth_type = \"scram\"", users: scramUser})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := tp.connectAs(ctx, appUser, appPassword, appDB)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var pid int32
	var ssl bool
	if err := conn.QueryRow(ctx, "SELECT pid, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&pid, &ssl); err != nil {
		t.Fatal(err)
	}
	if !ssl {
		t.Fatal("the server connection does not use TLS")
	}
	admin, err := pgx.Connect(ctx, server.ConnString(server.SuperUser, server.SuperPassword, appDB))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	terminateAndWait(t, ctx, admin, pid)
	if got := backendPID(t, ctx, conn); got == pid {
		t.Fatalf("served by the terminated backend %d", pid)
	}
}

// TestConsoleTLS: the admin console is served over TLS when the client
// asks (pgx, sslmode=verify-full, sees pgtender's certificate), and
// refused without TLS under tls_client_required; SHOW, PAUSE (whose wait
// watches the raw socket under the TLS layer) and RESUME work through it.
func TestConsoleTLS(t *testing.T) {
	leaf, tlsLines := poolerCert(t, t.TempDir())
	tp := startPooler(t, poolerOptions{
		general: joinLines(tlsLines, "tls_client_required = true", `passthrough_auth = "enabled_plain"`),
		pool:    "pool_size = 2\n\n[admin]\npassword = \"" + consolePassword + "\"",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	host, port, _ := net.SplitHostPort(tp.addr)
	cc, err := pgx.ParseConfig(fmt.Sprintf("postgres://%s:%s@%s/pgbouncer?sslmode=verify-full&connect_timeout=10",
		consoleUser, consolePassword, net.JoinHostPort(host, port)))
	if err != nil {
		t.Fatal(err)
	}
	cc.TLSConfig.RootCAs = testCA.Pool()
	cc.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	console, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatalf("console over TLS: %v", err)
	}
	defer console.Close(ctx)
	tlsConn, ok := console.PgConn().Conn().(*tls.Conn)
	if !ok {
		t.Fatal("the console session is not over TLS")
	}
	if got := tlsConn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(leaf.Cert.SerialNumber) != 0 {
		t.Errorf("the console showed certificate %v, want pgtender's %v", got, leaf.Cert.SerialNumber)
	}
	for _, command := range []string{"SHOW POOLS", "PAUSE " + appDB, "RESUME " + appDB, "SHOW DATABASES"} {
		if err := consoleExec(ctx, console, command); err != nil {
			t.Errorf("%s over TLS: %v", command, err)
		}
	}
	if _, err := consoleConnect(ctx, tp.addr, consoleUser, consolePassword, "pgbouncer"); sqlState(err) != "28000" {
		t.Errorf("the console without TLS under tls_client_required: %v, want 28000", err)
	}
}
