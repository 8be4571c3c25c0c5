package pooler

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/config"
)

// Protocol tests of the relay (the transaction-mode release point, session
// mode, client and server failures, cancel routing) and of the startup
// packet handling, each against the fake Postgres of fakepg_test.go with
// real pgconn clients, or a raw protocol client where pgconn cannot send
// what the test needs. Regression tests for bugs found in review are at
// the end.

func TestStartupEncryptionRequestsAnsweredN(t *testing.T) {
	for name, request := range map[string][]byte{
		"SSLRequest":    encodeMsgs(t, &pgproto3.SSLRequest{}),
		"GSSENCRequest": encodeMsgs(t, &pgproto3.GSSEncRequest{}),
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			conn := h.dial()
			writeRaw(t, conn, request)
			var answer [1]byte
			_ = conn.SetReadDeadline(time.Now().Add(waitTimeout))
			if _, err := io.ReadFull(conn, answer[:]); err != nil || answer[0] != 'N' {
				t.Fatalf("answer %q, err %v; want 'N'", answer[:], err)
			}
			writeRaw(t, conn, encodeMsgs(t, testStartup(pgproto3.ProtocolVersion30, nil)))
			fe := pgproto3.NewFrontend(conn, conn)
			expectLogin(t, conn, fe)
			expectWorks(t, conn, fe)
		})
	}
	t.Run("pgconn sslmode=prefer", func(t *testing.T) {
		h := newHarness(t, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgconn.Connect(ctx, strings.Replace(h.connString(testDatabase), "sslmode=disable", "sslmode=prefer", 1))
		if err != nil {
			t.Fatalf("connect with sslmode=prefer: %v", err)
		}
		defer closeClient(conn)
		mustWhoami(t, conn)
	})
}

// TestStartupProtocol32Negotiated: a 3.2 StartupMessage (with a protocol
// option) gets NegotiateProtocolVersion naming 3.0 and the option, then a
// normal 3.0 login.
func TestStartupProtocol32Negotiated(t *testing.T) {
	h := newHarness(t, nil)
	conn := h.dial()
	writeRaw(t, conn, encodeMsgs(t, testStartup(pgproto3.ProtocolVersion32, map[string]string{"_pq_.test_option": "1"})))
	fe := pgproto3.NewFrontend(conn, conn)
	msg := receiveMessage(t, conn, fe)
	npv, ok := msg.(*pgproto3.NegotiateProtocolVersion)
	if !ok {
		t.Fatalf("first reply %s, want NegotiateProtocolVersion", describeMsg(msg))
	}
	if npv.NewestMinorProtocol != 0 || !slices.Equal(npv.UnrecognizedOptions, []string{"_pq_.test_option"}) {
		t.Errorf("NegotiateProtocolVersion %+v, want minor 0 and [_pq_.test_option]", npv)
	}
	expectLogin(t, conn, fe)
	expectWorks(t, conn, fe)

	// A real client asking for 3.2 settles on 3.0.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := pgconn.Connect(ctx, h.connString(testDatabase)+" max_protocol_version=3.2")
	if err != nil {
		t.Fatalf("pgconn with max_protocol_version=3.2: %v", err)
	}
	defer closeClient(client)
	mustWhoami(t, client)
}

// TestStartupMalformedPacket: startup packets with a body over 10,000 bytes
// or under 4, or with a broken parameter list, get FATAL 08P01 and a close;
// an unknown protocol major version gets FATAL 0A000.
func TestStartupMalformedPacket(t *testing.T) {
	cases := map[string][]byte{
		"oversized":     {0, 0, 0x27, 0x15}, // 10005 = a 10,001-byte body; only the length word is sent
		"too short":     {0, 0, 0, 4},
		"unterminated":  append([]byte{0, 0, 0, 16, 0, 3, 0, 0}, "user\x00app"...),
		"no value":      append([]byte{0, 0, 0, 14, 0, 3, 0, 0}, "user\x00\x00"...),
		"unknown major": append([]byte{0, 0, 0, 9, 0, 9, 0, 0}, 0),
	}
	codes := map[string]string{"unknown major": sqlstateFeatureNotSupported}
	for name, packet := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, nil)
			conn := h.dial()
			writeRaw(t, conn, packet)
			code := codes[name]
			if code == "" {
				code = sqlstateProtocolViolation
			}
			er := expectFatal(t, conn, code)
			if strings.Contains(er.Message, "timeout") {
				t.Errorf("the pooler waited for more bytes (%q) instead of refusing the packet", er.Message)
			}
		})
	}
}

func TestStartupUnknownDatabase(t *testing.T) {
	h := newHarness(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, h.connString("nope"))
	if err == nil {
		closeClient(conn)
		t.Fatal("login to an unknown database succeeded")
	}
	if code := pgErrorCode(err); code != sqlstateInvalidCatalogName {
		t.Fatalf("login to an unknown database: %v, want SQLSTATE 3D000", err)
	}
	if n := h.fake.connCount(); n != 0 {
		t.Errorf("fake saw %d server connections for an unknown database", n)
	}
}

// TestStartupStalledLoginTimesOut: client_login_timeout ends a login that
// stalls, with FATAL 08P01 once the client sent something and silently
// when it never did (a bare TCP connect is not a login).
func TestStartupStalledLoginTimesOut(t *testing.T) {
	const loginTimeout = 300 * time.Millisecond
	h := newHarness(t, func(cfg *config.Config) {
		cfg.General.ClientLoginTimeout = config.Milliseconds(loginTimeout / time.Millisecond)
	})
	t.Run("partial startup packet", func(t *testing.T) {
		conn := h.dial()
		start := time.Now()
		writeRaw(t, conn, []byte{0, 0, 0, 40, 0, 3})
		er := expectFatal(t, conn, sqlstateProtocolViolation)
		if !strings.Contains(er.Message, "client_login_timeout") {
			t.Errorf("message %q does not name client_login_timeout", er.Message)
		}
		if elapsed := time.Since(start); elapsed < loginTimeout-50*time.Millisecond || elapsed > 5*time.Second {
			t.Errorf("login ended after %v, want about %v", elapsed, loginTimeout)
		}
	})
	t.Run("silent", func(t *testing.T) {
		conn := h.dial()
		expectEOF(t, conn)
	})
}

// Regression tests for relay bugs found in review. Each comment says what
// went wrong in the version that failed it.
