package auth

import (
	"bytes"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/pgtender/pgtender/config"
	"github.com/xdg-go/scram"
)

// ClientConn is the client side of an authentication exchange, implemented
// by the pooler over its framer.
type ClientConn interface {
	// Send encodes, writes and flushes one message.
	Send(msg pgproto3.BackendMessage) error
	// Receive returns the next whole message from the client: its type
	// byte and its body without the 4-byte length. body is valid only
	// until the next Receive.
	Receive() (msgType byte, body []byte, err error)
}

var (
	// ErrPasswordMismatch means the client did not prove it knows the
	// password: the pooler answers FATAL 28P01.
	ErrPasswordMismatch = errors.New("auth: password authentication failed")
	// ErrProtocol means the client broke the exchange (a wrong message
	// type, malformed SASL data): the pooler answers FATAL 08P01. It is
	// wrapped with the detail.
	ErrProtocol = errors.New("auth: protocol violation during authentication")
)

const (
	// msgPassword is the type byte of every frontend authentication
	// message: PasswordMessage, SASLInitialResponse and SASLResponse.
	msgPassword = 'p'
	// mechSCRAMSHA256 is the only SASL mechanism advertised; without TLS
	// channel binding there is no -PLUS variant to offer.
	mechSCRAMSHA256 = "SCRAM-SHA-256"
	// detailLimit bounds how much client-sent text an error quotes.
	detailLimit = 64
)

// scramMechanisms is what AuthenticationSASL advertises. It is shared and
// must not be modified.
var scramMechanisms = []string{mechSCRAMSHA256}

// AuthenticateClient runs the whole exchange for method with a client that
// claims to be creds' user, and returns nil once the client is
// authenticated. It does not send AuthenticationOk: the caller does, after
// whatever else it checks. creds may be nil only for config.AuthTrust.
//
// It returns ErrPasswordMismatch for a wrong password, an error wrapping
// ErrProtocol when the client broke the exchange, an error wrapping
// ErrUnusableSecret when creds cannot serve method (checked before anything
// is sent), and the ClientConn's error (wrapped) when it fails.
func AuthenticateClient(c ClientConn, method config.AuthType, creds *Credentials) error {
	if method == config.AuthTrust {
		return nil
	}
	if err := creds.Supports(method); err != nil {
		return err
	}
	switch method {
	case config.AuthSCRAM:
		return authenticateSCRAM(c, creds)
	case config.AuthMD5:
		return authenticateMD5(c, creds)
	default: // config.AuthPlain; Supports rejected anything else
		return authenticatePlain(c, creds)
	}
}

// ReadCleartextPassword sends AuthenticationCleartextPassword and returns the
// password the client answers with (a PasswordMessage), for passthrough
// authentication and for auth_type plain. An empty password is refused with
// ErrPasswordMismatch, as Postgres refuses it, so it is never looked up.
func ReadCleartextPassword(c ClientConn) (string, error) {
	if err := c.Send(&pgproto3.AuthenticationCleartextPassword{}); err != nil {
		return "", fmt.Errorf("auth: sending AuthenticationCleartextPassword: %w", err)
	}
	body, err := receivePassword(c, "password")
	if err != nil {
		return "", err
	}
	password, err := parsePasswordMessage(body)
	if err != nil {
		return "", err
	}
	if password == "" {
		return "", ErrPasswordMismatch
	}
	return password, nil
}

// authenticateSCRAM runs SCRAM-SHA-256 with xdg-go/scram's server:
// AuthenticationSASL → SASLInitialResponse (client-first-message) →
// AuthenticationSASLContinue (server-first) → SASLResponse (client-final) →
// AuthenticationSASLFinal (server-final). An invalid proof is reported with
// ErrPasswordMismatch (Postgres sends no "e=" message to the client, and
// neither does this: the pooler's FATAL ends the exchange).
func authenticateSCRAM(c ClientConn, creds *Credentials) error {
	if err := c.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: scramMechanisms}); err != nil {
		return fmt.Errorf("auth: sending AuthenticationSASL: %w", err)
	}
	body, err := receivePassword(c, "SASLInitialResponse")
	if err != nil {
		return err
	}
	mechanism, clientFirst, err := parseSASLInitialResponse(body)
	if err != nil {
		return err
	}
	if mechanism != mechSCRAMSHA256 {
		return fmt.Errorf("%w: client selected SASL mechanism %s, only %s is offered",
			ErrProtocol, quote(mechanism), mechSCRAMSHA256)
	}

	conv := creds.scramServer.NewConversation()
	serverFirst, err := conv.Step(clientFirst)
	if err != nil {
		// The lookup never fails, so this is always the client's message.
		return fmt.Errorf("%w: invalid SCRAM client-first-message: %v", ErrProtocol, err)
	}
	if err := c.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(serverFirst)}); err != nil {
		return fmt.Errorf("auth: sending AuthenticationSASLContinue: %w", err)
	}

	body, err = receivePassword(c, "SASLResponse")
	if err != nil {
		return err
	}
	// pgproto3.SASLResponse.Decode only takes the body as Data; converting
	// to a string copies it before the next Receive can reuse it.
	serverFinal, err := conv.Step(string(body))
	if err != nil {
		if serverFinal == scram.ErrInvalidProof {
			return ErrPasswordMismatch
		}
		return fmt.Errorf("%w: invalid SCRAM client-final-message: %v", ErrProtocol, err)
	}
	if !conv.Valid() { // cannot happen after a nil error; never admit on doubt
		return ErrPasswordMismatch
	}
	if err := c.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte(serverFinal)}); err != nil {
		return fmt.Errorf("auth: sending AuthenticationSASLFinal: %w", err)
	}
	return nil
}

// authenticateMD5 sends a random 4-byte salt and checks the client's
// "md5" + hex(md5(hex(md5(password + user)) + salt)).
func authenticateMD5(c ClientConn, creds *Credentials) error {
	var salt [4]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return fmt.Errorf("auth: generating an md5 salt: %w", err)
	}
	if err := c.Send(&pgproto3.AuthenticationMD5Password{Salt: salt}); err != nil {
		return fmt.Errorf("auth: sending AuthenticationMD5Password: %w", err)
	}
	body, err := receivePassword(c, "password")
	if err != nil {
		return err
	}
	got, err := parsePasswordMessage(body)
	if err != nil {
		return err
	}
	want := md5Response(&creds.md5Inner, salt)
	// The expected length (35) is public, so the early length check of
	// ConstantTimeCompare gives nothing away.
	if subtle.ConstantTimeCompare([]byte(got), want[:]) != 1 {
		return ErrPasswordMismatch
	}
	return nil
}

// md5Response is "md5" + hex(md5(inner + salt)), what a client that knows
// the password answers to the salt.
func md5Response(inner *[md5HexLen]byte, salt [4]byte) [3 + md5HexLen]byte {
	var buf [md5HexLen + 4]byte
	copy(buf[:], inner[:])
	copy(buf[md5HexLen:], salt[:])
	sum := md5.Sum(buf[:])
	var out [3 + md5HexLen]byte
	copy(out[:], "md5")
	hex.Encode(out[3:], sum[:])
	return out
}

// authenticatePlain asks for the password in clear and checks it against
// whatever creds hold, as Postgres's plain_crypt_verify does.
func authenticatePlain(c ClientConn, creds *Credentials) error {
	password, err := ReadCleartextPassword(c)
	if err != nil {
		return err
	}
	var ok bool
	switch creds.kind {
	case kindPlaintext:
		// Digests, so the comparison does not leak the password's length.
		got := sha256.Sum256([]byte(password))
		ok = subtle.ConstantTimeCompare(got[:], creds.plainDigest[:]) == 1
	case kindMD5:
		got := md5Hex(password + creds.user)
		ok = subtle.ConstantTimeCompare(got[:], creds.md5Inner[:]) == 1
	case kindSCRAM:
		ok, err = verifySCRAMPlain(creds.scram, password)
		if err != nil {
			return err
		}
	}
	if !ok {
		return ErrPasswordMismatch
	}
	return nil
}

// receivePassword receives the next message and checks it is a 'p'. what
// names the expected message for the error.
func receivePassword(c ClientConn, what string) ([]byte, error) {
	msgType, body, err := c.Receive()
	if err != nil {
		return nil, fmt.Errorf("auth: waiting for the client's %s message: %w", what, err)
	}
	if msgType != msgPassword {
		return nil, fmt.Errorf("%w: expected a %s message ('p'), got message type %q", ErrProtocol, what, msgType)
	}
	return body, nil
}

// parsePasswordMessage returns the string of a PasswordMessage body, which
// must be exactly one NUL-terminated string (Postgres checks the same).
func parsePasswordMessage(body []byte) (string, error) {
	if len(body) == 0 || bytes.IndexByte(body, 0) != len(body)-1 {
		return "", fmt.Errorf("%w: malformed password message", ErrProtocol)
	}
	return string(body[:len(body)-1]), nil
}

// parseSASLInitialResponse decodes a SASLInitialResponse with pgproto3 and
// also checks the declared data length, which pgproto3 skips: it must be
// the length of the rest of the message, or -1 with nothing after it.
func parseSASLInitialResponse(body []byte) (mechanism, data string, err error) {
	var msg pgproto3.SASLInitialResponse
	if err := msg.Decode(body); err != nil {
		return "", "", fmt.Errorf("%w: malformed SASLInitialResponse: %v", ErrProtocol, err)
	}
	declared := int32(binary.BigEndian.Uint32(body[len(body)-len(msg.Data)-4:]))
	if declared != int32(len(msg.Data)) && (declared != -1 || len(msg.Data) != 0) {
		return "", "", fmt.Errorf("%w: malformed SASLInitialResponse: declared data length %d, got %d bytes",
			ErrProtocol, declared, len(msg.Data))
	}
	return msg.AuthMechanism, string(msg.Data), nil
}

// quote quotes client-sent text for an error, bounded in length.
func quote(s string) string {
	if len(s) > detailLimit {
		return fmt.Sprintf("%q...", s[:detailLimit])
	}
	return fmt.Sprintf("%q", s)
}
