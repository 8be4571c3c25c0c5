package auth

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgtender/pgtender/config"
)

var allMethods = []config.AuthType{config.AuthSCRAM, config.AuthMD5, config.AuthPlain, config.AuthTrust}

// FuzzNewCredentials feeds arbitrary users.toml passwords to NewCredentials:
// it must not panic, only a "SCRAM-SHA-256$" string may be refused, and
// neither the error nor the String form may show the input.
func FuzzNewCredentials(f *testing.F) {
	rfcSalt, _ := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	valid := scramSecret(f, "pencil", rfcSalt, 4096)
	for _, seed := range []string{
		"", "pencil", "crayón ü", "I\u00adX", "bad\xffutf8",
		md5Secret("pencil", "alice"), "md5" + strings.Repeat("A", 32), "md5" + strings.Repeat("g", 32), "md5",
		valid,
		strings.Replace(valid, "4096", "0", 1),
		strings.Replace(valid, "4096", "99999999999", 1),
		valid[:len(valid)-4],
		valid + "$",
		"SCRAM-SHA-256$", "SCRAM-SHA-256$1:$:", "SCRAM-SHA-256$1:YQ==$YQ==:YQ==",
		"SCRAM-SHA-256$4096:W22Z\naJ0SNY7soEsUEjb6gQ==$a:b",
	} {
		f.Add("alice", seed)
	}
	f.Fuzz(func(t *testing.T, user, password string) {
		c, err := NewCredentials(user, password)
		if err != nil {
			if !strings.HasPrefix(password, scramPrefix) {
				t.Fatalf("refused a password that is not a SCRAM secret: %v", err)
			}
			if rest := password[len(scramPrefix):]; len(rest) >= 8 && strings.Contains(err.Error(), rest) {
				t.Fatalf("error %q shows the secret", err)
			}
			return
		}
		if len(password) >= 8 && !strings.Contains(user, password) && strings.Contains(c.String(), password) {
			t.Fatalf("String() = %q shows the password", c.String())
		}
		switch c.kind {
		case kindNone:
			if password != "" {
				t.Fatalf("kind none for a non-empty password")
			}
		case kindSCRAM:
			if len(c.scram.StoredKey) != 32 || len(c.scram.ServerKey) != 32 || c.scram.Iters < 1 || c.scram.Salt == "" {
				t.Fatalf("accepted a bad SCRAM secret: %+v", c.scram.KeyFactors)
			}
		case kindMD5:
			if !isMD5Hash(password) {
				t.Fatalf("kind md5 for %q", password)
			}
		}
		for _, method := range allMethods {
			_ = c.Supports(method)
		}
	})
}

// FuzzSCRAMExchange feeds two arbitrary client messages to a SCRAM
// exchange. It must not panic, and since the server nonce is random, no
// input can authenticate: the result is always ErrPasswordMismatch,
// ErrProtocol or the end of the script.
func FuzzSCRAMExchange(f *testing.F) {
	creds := mustCredentials(f, "alice", "pencil")
	initial := func(mech, data string) []byte {
		_, body := frontendBody(f, &pgproto3.SASLInitialResponse{AuthMechanism: mech, Data: []byte(data)})
		return body
	}
	seeds := []struct {
		t1    byte
		first []byte
		t2    byte
		final []byte
	}{
		{'p', initial("SCRAM-SHA-256", "n,,n=,r=rOprNGfwEbeRWgbNEkqO"), 'p',
			[]byte("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")},
		{'p', initial("SCRAM-SHA-256", "n,,n=user,r=abc"), 'p', []byte("c=biws,r=abc,p=")},
		{'p', initial("SCRAM-SHA-256", "y,,n=,r=abc"), 'p', []byte("c=eSws,r=abc,x=ext,p=AAAA")},
		{'p', initial("SCRAM-SHA-256", "p=tls-server-end-point,,n=,r=abc"), 'p', nil},
		{'p', initial("SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc"), 'p', nil},
		{'p', initial("SCRAM-SHA-256", "n,a=admin,n=,r=abc"), 'p', []byte("c=bixhPWFkbWluLA==,r=abc,p=AAAA")},
		{'p', initial("SCRAM-SHA-256", "n,,n==2C=3D,r=,"), 'p', []byte(",,,")},
		{'p', initial("SCRAM-SHA-256", ""), 'p', nil},
		{'p', []byte("SCRAM-SHA-256\x00\xff\xff\xff\xff"), 'p', nil},
		{'p', []byte("SCRAM-SHA-256\x00\x00\x00\x00\x05n,,n="), 'p', nil},
		{'p', []byte("\x00"), 'p', nil},
		{'Q', []byte("select 1\x00"), 'p', nil},
	}
	for _, s := range seeds {
		f.Add(s.t1, s.first, s.t2, s.final)
	}
	f.Fuzz(func(t *testing.T, t1 byte, first []byte, t2 byte, final []byte) {
		conn := newFakeConn(raw(t1, first), raw(t2, final))
		err := AuthenticateClient(conn, config.AuthSCRAM, creds)
		if err == nil {
			t.Fatal("arbitrary client messages were authenticated")
		}
		if err != ErrPasswordMismatch && !errors.Is(err, ErrProtocol) && !errors.Is(err, io.EOF) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}

// FuzzPasswordExchange feeds an arbitrary answer to the md5 and plain
// exchanges and to ReadCleartextPassword. Only the right cleartext password
// may pass plain; nothing may pass md5 (the salt is random).
func FuzzPasswordExchange(f *testing.F) {
	const password = "pencil"
	creds := map[secretKind]*Credentials{
		kindPlaintext: mustCredentials(f, "alice", password),
		kindMD5:       mustCredentials(f, "alice", md5Secret(password, "alice")),
		kindSCRAM:     mustCredentials(f, "alice", scramSecret(f, password, []byte("salt"), 16)),
	}
	for _, seed := range []string{"pencil\x00", "pencil", "\x00", "", "pen\x00cil\x00", md5Secret(password, "alice") + "\x00", "md5" + strings.Repeat("0", 32) + "\x00"} {
		f.Add(byte('p'), []byte(seed))
	}
	f.Add(byte('X'), []byte(nil))
	f.Fuzz(func(t *testing.T, msgType byte, body []byte) {
		right := msgType == 'p' && string(body) == password+"\x00"
		for kind, c := range creds {
			for _, method := range []config.AuthType{config.AuthMD5, config.AuthPlain} {
				if c.Supports(method) != nil {
					continue
				}
				err := AuthenticateClient(newFakeConn(raw(msgType, body)), method, c)
				if want := method == config.AuthPlain && right; (err == nil) != want {
					t.Fatalf("%s with a %s secret, answer %q: err = %v", method, kind, body, err)
				}
				if err != nil && err != ErrPasswordMismatch && !errors.Is(err, ErrProtocol) {
					t.Fatalf("%s: unexpected error kind: %v", method, err)
				}
			}
		}
		got, err := ReadCleartextPassword(newFakeConn(raw(msgType, body)))
		if err == nil && (msgType != 'p' || got+"\x00" != string(body) || got == "") {
			t.Fatalf("ReadCleartextPassword(%q) = %q", body, got)
		}
	})
}

// FuzzParsePasswordMessage checks parsePasswordMessage against its
// definition (exactly one NUL, at the end) and against pgproto3's
// decoder. The corpus in testdata holds PasswordMessages captured from
// pgx and psql (cleartext and md5 answers).
func FuzzParsePasswordMessage(f *testing.F) {
	for _, seed := range []string{"pencil\x00", "\x00", "", "pencil", "pen\x00cil\x00", "\x00\x00", "crayón ü\u00a0!\x00", "\xff\xfe\x00"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parsePasswordMessage(body)
		valid := len(body) > 0 && strings.IndexByte(string(body), 0) == len(body)-1
		if (err == nil) != valid {
			t.Fatalf("parsePasswordMessage(%q): err = %v, want valid = %v", body, err, valid)
		}
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			// The text must not depend on the input (it is a password).
			if _, errNil := parsePasswordMessage(nil); err.Error() != errNil.Error() {
				t.Fatalf("error %q depends on the message", err)
			}
			return
		}
		var msg pgproto3.PasswordMessage
		if err := msg.Decode(body); err != nil || msg.Password != got {
			t.Fatalf("pgproto3 decodes %q as %q (%v), we as %q", body, msg.Password, err, got)
		}
	})
}

// FuzzParseSASLInitialResponse checks that whatever parseSASLInitialResponse
// accepts is a well-formed message: encoding the result again with pgproto3
// gives back the input (or, for a declared length of -1, the input with
// that length written as 0). The corpus in testdata holds the messages pgx
// and psql send.
func FuzzParseSASLInitialResponse(f *testing.F) {
	initial := func(mech, data string) []byte {
		_, body := frontendBody(f, &pgproto3.SASLInitialResponse{AuthMechanism: mech, Data: []byte(data)})
		return body
	}
	for _, seed := range [][]byte{
		initial("SCRAM-SHA-256", "n,,n=,r=rOprNGfwEbeRWgbNEkqO"),
		initial("SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,n=,r=abc"),
		initial("", ""),
		[]byte("SCRAM-SHA-256\x00\xff\xff\xff\xff"),
		[]byte("SCRAM-SHA-256\x00\x00\x00\x00\x05n,,n="),
		[]byte("SCRAM-SHA-256\x00\x00\x00\x00\x03n,,n="),
		[]byte("SCRAM-SHA-256\x00\x7f\xff\xff\xff"),
		[]byte("SCRAM-SHA-256"),
		[]byte("\x00"),
		nil,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		mech, data, err := parseSASLInitialResponse(body)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v does not wrap ErrProtocol", err)
			}
			return
		}
		_, again := frontendBody(t, &pgproto3.SASLInitialResponse{AuthMechanism: mech, Data: []byte(data)})
		want := body
		if len(data) == 0 && strings.HasSuffix(string(body), "\xff\xff\xff\xff") {
			want = append(bytes.Clone(body[:len(body)-4]), 0, 0, 0, 0)
		}
		if !bytes.Equal(again, want) {
			t.Fatalf("parsed %q as (%q, %q), which encodes as %q", body, mech, data, again)
		}
	})
}

// FuzzRegistryAuthenticate presents arbitrary (user, database, password)
// triples to a registry that knows alice@app's password and a Postgres
// that accepts nothing else: only that exact triple may be admitted, and
// a refusal is one of the sentinels, whose text shows nothing.
func FuzzRegistryAuthenticate(f *testing.F) {
	for _, seed := range [][3]string{
		{"alice", "app", "pencil"}, {"alice", "app", "pencil\x00"}, {"alice", "app", "Pencil"},
		{"alice", "app", ""}, {"alice", "ap", "pencil"}, {"alic", "eapp", "pencil"},
		{"alice\x00", "app", "pencil"}, {"", "", ""}, {"bob", "app", "crayón ü\u00a0!"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	r := NewRegistry(config.PassthroughEnabledAllowChange, WithReverifyInterval(0))
	f.Cleanup(r.Close)
	verify := func(_ context.Context, key Key, password string) error {
		if key == alice && password == "pencil" {
			return nil
		}
		return fmt.Errorf("password authentication failed (SQLSTATE 28P01): %w", ErrRejected)
	}
	if err := r.Authenticate(context.Background(), Login{Key: alice, Password: "pencil"}, verify); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, user, database, password string) {
		login := Login{Key: Key{User: user, Database: database}, Password: password}
		err := r.Authenticate(context.Background(), login, verify)
		right := login.Key == alice && password == "pencil"
		if (err == nil) != right {
			t.Fatalf("Authenticate(%s) = %v, want admitted = %v", login, err, right)
		}
		// Only the sentinels themselves: their text cannot show the
		// password.
		if err != nil && err != ErrPasswordMismatch && err != ErrThrottled && err != ErrCachedRejection {
			t.Fatalf("Authenticate(%s): unexpected error: %v", login, err)
		}
	})
}
