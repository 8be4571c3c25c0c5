package auth

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/xdg-go/scram"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// reply is one scripted client answer. last is the last message the server
// sent before the Receive (nil if none).
type reply func(last pgproto3.BackendMessage) (msgType byte, body []byte, err error)

// fakeConn is a scripted ClientConn. Each Receive runs the next reply; with
// none left it returns io.EOF, as a client that hung up. It scribbles over
// the previous body on each Receive, to catch code that keeps a body past
// the next Receive.
type fakeConn struct {
	sent     []pgproto3.BackendMessage
	script   []reply
	lastBody []byte
	sendErr  error
}

func newFakeConn(script ...reply) *fakeConn { return &fakeConn{script: script} }

func (f *fakeConn) Send(msg pgproto3.BackendMessage) error {
	if f.sendErr != nil {
		return f.sendErr
	}
	// Encode to check the message is valid on the wire.
	if _, err := msg.Encode(nil); err != nil {
		return err
	}
	f.sent = append(f.sent, msg)
	return nil
}

func (f *fakeConn) Receive() (byte, []byte, error) {
	for i := range f.lastBody {
		f.lastBody[i] = 0xAA
	}
	if len(f.script) == 0 {
		return 0, nil, io.EOF
	}
	next := f.script[0]
	f.script = f.script[1:]
	var last pgproto3.BackendMessage
	if len(f.sent) > 0 {
		last = f.sent[len(f.sent)-1]
	}
	msgType, body, err := next(last)
	f.lastBody = bytes.Clone(body)
	return msgType, f.lastBody, err
}

// raw replies with a fixed message.
func raw(msgType byte, body []byte) reply {
	return func(pgproto3.BackendMessage) (byte, []byte, error) { return msgType, body, nil }
}

// passwordMessage replies with a PasswordMessage carrying s.
func passwordMessage(s string) reply {
	return raw('p', append([]byte(s), 0))
}

// frontendBody encodes msg and returns its type and body (no length).
func frontendBody(tb testing.TB, msg pgproto3.FrontendMessage) (byte, []byte) {
	tb.Helper()
	buf, err := msg.Encode(nil)
	if err != nil {
		tb.Fatalf("encoding %T: %v", msg, err)
	}
	return buf[0], buf[5:]
}

// md5Client answers an AuthenticationMD5Password as libpq does.
func md5Client(tb testing.TB, user, password string) reply {
	return func(last pgproto3.BackendMessage) (byte, []byte, error) {
		challenge, ok := last.(*pgproto3.AuthenticationMD5Password)
		if !ok {
			tb.Fatalf("md5 client: server sent %T, want *AuthenticationMD5Password", last)
		}
		return 'p', append([]byte(md5Answer(password, user, challenge.Salt)), 0), nil
	}
}

// md5Answer is "md5" + hex(md5(hex(md5(password+user)) + salt)), computed
// independently of the package code.
func md5Answer(password, user string, salt [4]byte) string {
	inner := md5.Sum([]byte(password + user))
	outer := md5.Sum(append([]byte(hex.EncodeToString(inner[:])), salt[:]...))
	return "md5" + hex.EncodeToString(outer[:])
}

// scramClient is a SCRAM-SHA-256 client built on xdg-go/scram's client
// conversation, sending the given name in client-first-message ("" as libpq
// and pgx do).
type scramClient struct {
	tb   testing.TB
	conv *scram.ClientConversation
}

func newSCRAMClient(tb testing.TB, name, password string) *scramClient {
	tb.Helper()
	client, err := scram.SHA256.NewClient(name, password, "")
	if err != nil {
		tb.Fatalf("scram client: %v", err)
	}
	return &scramClient{tb: tb, conv: client.NewConversation()}
}

// newSCRAMClientUnprepped is a client that sends password as it is, with no
// SASLprep: the caller prepares it as the client under test would.
func newSCRAMClientUnprepped(tb testing.TB, password string) *scramClient {
	tb.Helper()
	client, err := scram.SHA256.NewClientUnprepped("", password, "")
	if err != nil {
		tb.Fatalf("scram client: %v", err)
	}
	return &scramClient{tb: tb, conv: client.NewConversation()}
}

// first answers AuthenticationSASL with a SASLInitialResponse.
func (s *scramClient) first() reply {
	return func(last pgproto3.BackendMessage) (byte, []byte, error) {
		sasl, ok := last.(*pgproto3.AuthenticationSASL)
		if !ok || len(sasl.AuthMechanisms) != 1 || sasl.AuthMechanisms[0] != "SCRAM-SHA-256" {
			s.tb.Fatalf("scram client: server sent %#v, want AuthenticationSASL offering only SCRAM-SHA-256", last)
		}
		clientFirst, err := s.conv.Step("")
		if err != nil {
			s.tb.Fatalf("scram client first step: %v", err)
		}
		msgType, body := frontendBody(s.tb, &pgproto3.SASLInitialResponse{AuthMechanism: "SCRAM-SHA-256", Data: []byte(clientFirst)})
		return msgType, body, nil
	}
}

// final answers AuthenticationSASLContinue with a SASLResponse.
func (s *scramClient) final() reply {
	return func(last pgproto3.BackendMessage) (byte, []byte, error) {
		cont, ok := last.(*pgproto3.AuthenticationSASLContinue)
		if !ok {
			s.tb.Fatalf("scram client: server sent %T, want *AuthenticationSASLContinue", last)
		}
		clientFinal, err := s.conv.Step(string(cont.Data))
		if err != nil {
			s.tb.Fatalf("scram client final step: %v", err)
		}
		msgType, body := frontendBody(s.tb, &pgproto3.SASLResponse{Data: []byte(clientFinal)})
		return msgType, body, nil
	}
}

// checkServerFinal checks the server proved it knows the keys (mutual
// authentication), as a real client does on AuthenticationSASLFinal.
func (s *scramClient) checkServerFinal(last pgproto3.BackendMessage) {
	s.tb.Helper()
	final, ok := last.(*pgproto3.AuthenticationSASLFinal)
	if !ok {
		s.tb.Fatalf("server's last message is %T, want *AuthenticationSASLFinal", last)
	}
	if _, err := s.conv.Step(string(final.Data)); err != nil || !s.conv.Valid() {
		s.tb.Fatalf("client rejected the server's signature: %v", err)
	}
}

func mustCredentials(tb testing.TB, user, password string) *Credentials {
	tb.Helper()
	c, err := NewCredentials(user, password)
	if err != nil {
		tb.Fatalf("NewCredentials(%q, ...): %v", user, err)
	}
	return c
}
