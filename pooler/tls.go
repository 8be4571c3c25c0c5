package pooler

import (
	"crypto/tls"
	"errors"

	"github.com/pgtender/pgtender/pooler/wire"
)

// Client-facing TLS.
//
// An SSLRequest is answered 'S' when the running configuration has a
// certificate (tls_certificate and tls_private_key), and the TLS handshake
// follows on the same socket, bounded by the login deadline that is
// already set on it; the startup then goes on over TLS. Without a
// certificate it is answered 'N' and the client goes on in plaintext or
// gives up. The certificate is part of runtimeState, read from its files
// at start and on every reload, so a reload that renews the files serves
// the new certificate to the next handshake while sessions already
// encrypted keep theirs. Admission control's shed path answers 'N' without
// looking (admission.go): a handshake per refused connection would cost
// the CPU that shedding is meant to save.

// sslRequestAccepted and sslRequestRefused answer an SSLRequest.
const (
	sslRequestAccepted = 'S'
	sslRequestRefused  = 'N'
)

// clientTLSConfig is the TLS configuration of client sessions. It serves
// whatever certificate the running configuration holds, so it is made once.
func (p *Pooler) clientTLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12, // as Postgres's ssl_min_protocol_version
		// libpq 17 and later offer ALPN "postgresql"; others offer none.
		NextProtos: []string{"postgresql"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if cert := p.state.Load().certificate; cert != nil {
				return cert, nil
			}
			return nil, errNoCertificate
		},
	}
}

// errNoCertificate fails a handshake that began just before a reload
// turned client TLS off.
var errNoCertificate = errors.New("client TLS is no longer configured")

// tlsHandshakeError is a failed TLS handshake with a client. The login
// ends without an error message: the client expects TLS records.
type tlsHandshakeError struct{ err error }

func (e *tlsHandshakeError) Error() string { return "TLS handshake: " + e.err.Error() }
func (e *tlsHandshakeError) Unwrap() error { return e.err }

// answerSSLRequest answers a client's SSLRequest and, when client TLS is
// configured, runs the handshake.
func (s *session) answerSSLRequest(state *runtimeState) error {
	if s.encrypted {
		return fatalError(sqlstateProtocolViolation, "invalid startup packet: SSLRequest on a connection already using TLS", nil)
	}
	if state.certificate == nil {
		return s.write([]byte{sslRequestRefused})
	}
	// Bytes sent after the SSLRequest and before the handshake were sent
	// in plaintext, and would be taken as part of the TLS session if read
	// now (Postgres refuses them too: CVE-2021-23214).
	if len(s.reader.Buffered()) > 0 {
		return fatalError(sqlstateProtocolViolation, "received unencrypted data after SSL request", nil)
	}
	if err := s.write([]byte{sslRequestAccepted}); err != nil {
		return err
	}
	conn := tls.Server(s.tcp, s.pooler.clientTLS)
	// The login deadline set on s.tcp bounds the handshake, which is
	// mostly a wait on the client (loginReader).
	s.clientWaitBegin()
	if err := conn.Handshake(); err != nil {
		return &tlsHandshakeError{err: err}
	}
	// A step: a client with a long round trip takes several for the
	// handshake, and must not be taken for a stalled one meanwhile.
	s.pooler.loginSlots.progress()
	s.clientWaitEnd()
	s.wmu.Lock()
	s.conn = conn
	s.out = nil
	s.wmu.Unlock()
	s.encrypted = true
	s.loginIn = loginReader{s, conn}
	s.reader = wire.NewReader(&s.loginIn, *s.bufRef, maxAuthMessageLen)
	return nil
}

// sslRequired refuses a plaintext client (28000, counted as rejected);
// why is for the log.
func sslRequired(why string) *clientError {
	ce := fatalError(sqlstateInvalidAuthorization, "SSL required", errors.New(why))
	ce.result = LoginRejected
	return ce
}
