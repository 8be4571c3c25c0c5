package auth

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgtender/pgtender/config"
	"github.com/xdg-go/scram"
)

// secretFor builds the users.toml form of password for the named kind.
func secretFor(tb testing.TB, kind secretKind, user, password string) string {
	switch kind {
	case kindPlaintext:
		return password
	case kindMD5:
		return md5Secret(password, user)
	case kindSCRAM:
		return scramSecret(tb, password, []byte("0123456789abcdef"), 4096)
	}
	return ""
}

func TestAuthenticateClient(t *testing.T) {
	const user, right = "alice", "pencil"
	wrongs := []string{"Pencil", "pencil ", "pencil\x00", "penci", "x"}

	type exchange func(t *testing.T, password string) (*fakeConn, func())
	scramExchange := func(name string) exchange {
		return func(t *testing.T, password string) (*fakeConn, func()) {
			client := newSCRAMClient(t, name, password)
			conn := newFakeConn(client.first(), client.final())
			return conn, func() { client.checkServerFinal(conn.sent[len(conn.sent)-1]) }
		}
	}
	md5Exchange := func(t *testing.T, password string) (*fakeConn, func()) {
		return newFakeConn(md5Client(t, user, password)), func() {}
	}
	plainExchange := func(t *testing.T, password string) (*fakeConn, func()) {
		return newFakeConn(passwordMessage(password)), func() {}
	}

	tests := []struct {
		method config.AuthType
		kind   secretKind
		run    exchange
		// sent lists the server messages of a successful exchange.
		sent []string
	}{
		{config.AuthSCRAM, kindPlaintext, scramExchange(""), []string{"*pgproto3.AuthenticationSASL", "*pgproto3.AuthenticationSASLContinue", "*pgproto3.AuthenticationSASLFinal"}},
		{config.AuthSCRAM, kindSCRAM, scramExchange(""), nil},
		{config.AuthSCRAM, kindPlaintext, scramExchange("somebody-else"), nil}, // the name in client-first is ignored, as Postgres does
		{config.AuthMD5, kindPlaintext, md5Exchange, []string{"*pgproto3.AuthenticationMD5Password"}},
		{config.AuthMD5, kindMD5, md5Exchange, nil},
		{config.AuthPlain, kindPlaintext, plainExchange, []string{"*pgproto3.AuthenticationCleartextPassword"}},
		{config.AuthPlain, kindMD5, plainExchange, nil},
		{config.AuthPlain, kindSCRAM, plainExchange, nil},
	}
	for _, tt := range tests {
		creds := mustCredentials(t, user, secretFor(t, tt.kind, user, right))
		t.Run(string(tt.method)+"/"+tt.kind.String()+"/right", func(t *testing.T) {
			conn, check := tt.run(t, right)
			if err := AuthenticateClient(conn, tt.method, creds); err != nil {
				t.Fatalf("right password: %v", err)
			}
			check()
			if tt.sent != nil {
				var got []string
				for _, m := range conn.sent {
					got = append(got, typeName(m))
				}
				if strings.Join(got, ",") != strings.Join(tt.sent, ",") {
					t.Errorf("server sent %v, want %v", got, tt.sent)
				}
			}
		})
		t.Run(string(tt.method)+"/"+tt.kind.String()+"/wrong", func(t *testing.T) {
			for _, wrong := range wrongs {
				if tt.method != config.AuthMD5 && strings.ContainsRune(wrong, 0) {
					continue // only md5 hashes it; a NUL in a PasswordMessage is a protocol error
				}
				conn, _ := tt.run(t, wrong)
				err := AuthenticateClient(conn, tt.method, creds)
				if err != ErrPasswordMismatch {
					t.Errorf("password %q: err = %v, want ErrPasswordMismatch", wrong, err)
				}
				if last, ok := lastSent(conn).(*pgproto3.AuthenticationSASLFinal); ok {
					t.Errorf("password %q: server sent SASLFinal %q after a wrong proof", wrong, last.Data)
				}
			}
		})
	}
}

func typeName(m pgproto3.BackendMessage) string { return fmt.Sprintf("%T", m) }

func lastSent(c *fakeConn) pgproto3.BackendMessage {
	if len(c.sent) == 0 {
		return nil
	}
	return c.sent[len(c.sent)-1]
}

func TestAuthenticateClientTrust(t *testing.T) {
	for _, creds := range []*Credentials{nil, mustCredentials(t, "alice", ""), mustCredentials(t, "alice", "pencil")} {
		conn := newFakeConn()
		if err := AuthenticateClient(conn, config.AuthTrust, creds); err != nil {
			t.Fatalf("trust with %v: %v", creds, err)
		}
		if len(conn.sent) != 0 {
			t.Fatalf("trust sent %d messages, want none", len(conn.sent))
		}
	}
}

func TestAuthenticateClientUnusableSecret(t *testing.T) {
	tests := []struct {
		method config.AuthType
		secret string
	}{
		{config.AuthSCRAM, md5Secret("pencil", "alice")},
		{config.AuthMD5, scramSecret(t, "pencil", []byte("salt"), 4096)},
		{config.AuthSCRAM, ""},
		{config.AuthMD5, ""},
		{config.AuthPlain, ""},
	}
	for _, tt := range tests {
		conn := newFakeConn()
		err := AuthenticateClient(conn, tt.method, mustCredentials(t, "alice", tt.secret))
		if !errors.Is(err, ErrUnusableSecret) {
			t.Errorf("%s with %q: err = %v, want ErrUnusableSecret", tt.method, tt.secret, err)
		}
		if len(conn.sent) != 0 {
			t.Errorf("%s with an unusable secret sent %d messages, want none", tt.method, len(conn.sent))
		}
	}
	if err := AuthenticateClient(newFakeConn(), config.AuthSCRAM, nil); !errors.Is(err, ErrUnusableSecret) {
		t.Errorf("scram with nil credentials: %v, want ErrUnusableSecret", err)
	}
	if err := AuthenticateClient(newFakeConn(), "ldap", mustCredentials(t, "alice", "pencil")); err == nil {
		t.Error("unknown auth_type accepted")
	}
}

// TestSCRAMRFC7677 runs the exchange of RFC 7677 section 3 byte for byte,
// with the server nonce fixed.
func TestSCRAMRFC7677(t *testing.T) {
	salt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	creds := mustCredentials(t, "user", scramSecret(t, "pencil", salt, 4096))
	creds.scramServer.WithNonceGenerator(func() string { return "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0" })

	first, firstBody := frontendBody(t, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte("n,,n=user,r=rOprNGfwEbeRWgbNEkqO")})
	final, finalBody := frontendBody(t, &pgproto3.SASLResponse{Data: []byte(
		"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")})
	conn := newFakeConn(raw(first, firstBody), raw(final, finalBody))
	if err := AuthenticateClient(conn, config.AuthSCRAM, creds); err != nil {
		t.Fatalf("RFC 7677 exchange: %v", err)
	}
	if got, want := string(conn.sent[1].(*pgproto3.AuthenticationSASLContinue).Data),
		"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"; got != want {
		t.Errorf("server-first-message = %q, want %q", got, want)
	}
	if got, want := string(conn.sent[2].(*pgproto3.AuthenticationSASLFinal).Data),
		"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="; got != want {
		t.Errorf("server-final-message = %q, want %q", got, want)
	}
}

// TestSCRAMSASLprep checks that a non-ASCII password is normalized the way
// clients normalize it, and that one SASLprep refuses is used as it is.
func TestSCRAMSASLprep(t *testing.T) {
	for _, tt := range []struct{ configured, typed string }{
		{"I\u00adX", "IX"},           // soft hyphen mapped to nothing on both sides
		{"\u2168", "I\u00adX"},       // NFKC on both sides
		{"a\u00a0b", "a b"},          // non-ASCII space
		{"priv\ue000", "priv\ue000"}, // prohibited by SASLprep: raw on both sides
	} {
		creds := mustCredentials(t, "alice", tt.configured)
		client := newSCRAMClientUnprepped(t, saslPrep(tt.typed))
		conn := newFakeConn(client.first(), client.final())
		if err := AuthenticateClient(conn, config.AuthSCRAM, creds); err != nil {
			t.Errorf("configured %q, typed %q: %v", tt.configured, tt.typed, err)
		}
	}
}

func TestAuthenticateClientProtocolErrors(t *testing.T) {
	creds := mustCredentials(t, "alice", "pencil")
	initial := func(mech, data string) reply {
		msgType, body := frontendBody(t, &pgproto3.SASLInitialResponse{AuthMechanism: mech, Data: []byte(data)})
		return raw(msgType, body)
	}
	withLength := func(mech string, length int32, data string) reply {
		body := append([]byte(mech), 0)
		body = binary.BigEndian.AppendUint32(body, uint32(length))
		return raw('p', append(body, data...))
	}
	// validFirst starts a real conversation so the second message is the
	// one under test.
	validFirst := func(t *testing.T) reply { return newSCRAMClient(t, "", "pencil").first() }
	response := func(data string) reply { return raw('p', []byte(data)) }

	tests := []struct {
		name   string
		method config.AuthType
		script func(t *testing.T) []reply
	}{
		{"scram: query instead of SASLInitialResponse", config.AuthSCRAM, func(*testing.T) []reply { return []reply{raw('Q', []byte("select 1\x00"))} }},
		{"scram: terminate", config.AuthSCRAM, func(*testing.T) []reply { return []reply{raw('X', nil)} }},
		{"scram: empty body", config.AuthSCRAM, func(*testing.T) []reply { return []reply{raw('p', nil)} }},
		{"scram: no NUL after the mechanism", config.AuthSCRAM, func(*testing.T) []reply { return []reply{raw('p', []byte("SCRAM-SHA-256"))} }},
		{"scram: no length", config.AuthSCRAM, func(*testing.T) []reply { return []reply{raw('p', []byte("SCRAM-SHA-256\x00\x00\x00"))} }},
		{"scram: length too long", config.AuthSCRAM, func(*testing.T) []reply { return []reply{withLength("SCRAM-SHA-256", 100, "n,,n=,r=abc")} }},
		{"scram: length too short", config.AuthSCRAM, func(*testing.T) []reply { return []reply{withLength("SCRAM-SHA-256", 3, "n,,n=,r=abc")} }},
		{"scram: length -1 with data", config.AuthSCRAM, func(*testing.T) []reply { return []reply{withLength("SCRAM-SHA-256", -1, "n,,n=,r=abc")} }},
		{"scram: length -1", config.AuthSCRAM, func(*testing.T) []reply { return []reply{withLength("SCRAM-SHA-256", -1, "")} }},
		{"scram: PLUS mechanism", config.AuthSCRAM, func(*testing.T) []reply {
			return []reply{initial("SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc")}
		}},
		{"scram: unknown mechanism", config.AuthSCRAM, func(*testing.T) []reply { return []reply{initial("OAUTHBEARER", "n,,")} }},
		{"scram: channel binding requested", config.AuthSCRAM, func(*testing.T) []reply {
			return []reply{initial("SCRAM-SHA-256", "p=tls-server-end-point,,n=,r=abc")}
		}},
		{"scram: empty client-first", config.AuthSCRAM, func(*testing.T) []reply { return []reply{initial("SCRAM-SHA-256", "")} }},
		{"scram: extensions", config.AuthSCRAM, func(*testing.T) []reply { return []reply{initial("SCRAM-SHA-256", "n,,m=ext,n=,r=abc")} }},
		{"scram: bad name encoding", config.AuthSCRAM, func(*testing.T) []reply { return []reply{initial("SCRAM-SHA-256", "n,,n=a=b,r=abc")} }},
		{"scram: no nonce", config.AuthSCRAM, func(*testing.T) []reply { return []reply{initial("SCRAM-SHA-256", "n,,n=,x=abc")} }},
		{"scram: query instead of SASLResponse", config.AuthSCRAM, func(t *testing.T) []reply {
			return []reply{validFirst(t), raw('Q', []byte("select 1\x00"))}
		}},
		{"scram: empty client-final", config.AuthSCRAM, func(t *testing.T) []reply { return []reply{validFirst(t), response("")} }},
		{"scram: wrong nonce", config.AuthSCRAM, func(t *testing.T) []reply {
			return []reply{validFirst(t), response("c=biws,r=not-the-nonce,p=" + base64.StdEncoding.EncodeToString(make([]byte, 32)))}
		}},
		{"scram: wrong channel binding", config.AuthSCRAM, func(t *testing.T) []reply {
			return []reply{validFirst(t), func(last pgproto3.BackendMessage) (byte, []byte, error) {
				nonce := strings.TrimPrefix(strings.Split(string(last.(*pgproto3.AuthenticationSASLContinue).Data), ",")[0], "r=")
				return 'p', []byte("c=eSws,r=" + nonce + ",p=" + base64.StdEncoding.EncodeToString(make([]byte, 32))), nil
			}}
		}},
		{"scram: short proof", config.AuthSCRAM, func(t *testing.T) []reply {
			return []reply{validFirst(t), func(last pgproto3.BackendMessage) (byte, []byte, error) {
				nonce := strings.TrimPrefix(strings.Split(string(last.(*pgproto3.AuthenticationSASLContinue).Data), ",")[0], "r=")
				return 'p', []byte("c=biws,r=" + nonce + ",p=" + base64.StdEncoding.EncodeToString(make([]byte, 8))), nil
			}}
		}},
		{"scram: proof not base64", config.AuthSCRAM, func(t *testing.T) []reply {
			return []reply{validFirst(t), func(last pgproto3.BackendMessage) (byte, []byte, error) {
				nonce := strings.TrimPrefix(strings.Split(string(last.(*pgproto3.AuthenticationSASLContinue).Data), ",")[0], "r=")
				return 'p', []byte("c=biws,r=" + nonce + ",p=***"), nil
			}}
		}},
		{"md5: query instead of password", config.AuthMD5, func(*testing.T) []reply { return []reply{raw('Q', []byte("x\x00"))} }},
		{"md5: no NUL", config.AuthMD5, func(*testing.T) []reply { return []reply{raw('p', []byte("md5abc"))} }},
		{"md5: two strings", config.AuthMD5, func(*testing.T) []reply { return []reply{raw('p', []byte("md5abc\x00x\x00"))} }},
		{"md5: empty body", config.AuthMD5, func(*testing.T) []reply { return []reply{raw('p', nil)} }},
		{"plain: NUL inside", config.AuthPlain, func(*testing.T) []reply { return []reply{raw('p', []byte("pen\x00cil\x00"))} }},
		{"plain: sync instead of password", config.AuthPlain, func(*testing.T) []reply { return []reply{raw('S', nil)} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := newFakeConn(tt.script(t)...)
			err := AuthenticateClient(conn, tt.method, creds)
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
			if strings.Contains(err.Error(), "pencil") {
				t.Errorf("error %q contains the password", err)
			}
			if _, ok := lastSent(conn).(*pgproto3.AuthenticationSASLFinal); ok {
				t.Error("server sent SASLFinal after a protocol error")
			}
		})
	}
}

func TestAuthenticateClientConnErrors(t *testing.T) {
	creds := mustCredentials(t, "alice", "pencil")
	for _, method := range []config.AuthType{config.AuthSCRAM, config.AuthMD5, config.AuthPlain} {
		// The client hangs up instead of answering.
		err := AuthenticateClient(newFakeConn(), method, creds)
		if !errors.Is(err, io.EOF) || errors.Is(err, ErrProtocol) || errors.Is(err, ErrPasswordMismatch) {
			t.Errorf("%s, client gone: err = %v, want io.EOF only", method, err)
		}
		// Hangs up in the middle of SCRAM.
		if method == config.AuthSCRAM {
			err := AuthenticateClient(newFakeConn(newSCRAMClient(t, "", "pencil").first()), method, creds)
			if !errors.Is(err, io.EOF) {
				t.Errorf("scram, client gone after first message: %v, want io.EOF", err)
			}
		}
		sendErr := errors.New("broken pipe")
		conn := newFakeConn()
		conn.sendErr = sendErr
		if err := AuthenticateClient(conn, method, creds); !errors.Is(err, sendErr) {
			t.Errorf("%s, send fails: err = %v, want the send error", method, err)
		}
	}
}

func TestReadCleartextPassword(t *testing.T) {
	tests := []struct {
		name    string
		reply   reply
		want    string
		wantErr error
	}{
		{"password", passwordMessage("pencil"), "pencil", nil},
		{"spaces kept", passwordMessage(" pen cil "), " pen cil ", nil},
		{"utf-8", passwordMessage("crayón"), "crayón", nil},
		{"empty", passwordMessage(""), "", ErrPasswordMismatch},
		{"no NUL", raw('p', []byte("pencil")), "", ErrProtocol},
		{"trailing data", raw('p', []byte("pencil\x00more")), "", ErrProtocol},
		{"wrong type", raw('Q', []byte("pencil\x00")), "", ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := newFakeConn(tt.reply)
			got, err := ReadCleartextPassword(conn)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("password = %q, want %q", got, tt.want)
			}
			if _, ok := lastSent(conn).(*pgproto3.AuthenticationCleartextPassword); !ok || len(conn.sent) != 1 {
				t.Errorf("server sent %v, want one AuthenticationCleartextPassword", conn.sent)
			}
		})
	}
	// The password outlives the body it came in.
	conn := newFakeConn(passwordMessage("pencil"))
	got, _ := ReadCleartextPassword(conn)
	_, _, _ = conn.Receive() // scribbles over the body
	if got != "pencil" {
		t.Fatalf("password changed to %q after the next Receive", got)
	}
}

// BenchmarkAuthenticateSCRAM is the server's cost of one SCRAM login with
// keys derived at load time (the client's keys are cached by xdg-go, so
// the client side costs HMACs too). Compare BenchmarkNewCredentials, which
// pays the 4096 PBKDF2 rounds once per configured user.
func BenchmarkAuthenticateSCRAM(b *testing.B) {
	creds := mustCredentials(b, "alice", "pencil")
	client, err := scram.SHA256.NewClient("", "pencil", "")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s := &scramClient{tb: b, conv: client.NewConversation()}
		if err := AuthenticateClient(newFakeConn(s.first(), s.final()), config.AuthSCRAM, creds); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewCredentials(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewCredentials("alice", "pencil"); err != nil {
			b.Fatal(err)
		}
	}
}
