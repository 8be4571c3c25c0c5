// Package loginceiling is the loopback ceiling of `make bench`: a server
// that completes Postgres logins with no backend behind it. It asks for a
// cleartext password (as a pooler's passthrough does), answers
// AuthenticationOk, a few ParameterStatus, BackendKeyData and
// ReadyForQuery, and answers the simple query "SELECT 1". Measured with the
// same load generator as the poolers, it bounds the logins/s any pooler can
// reach on the machine: the generator's and the kernel's share of a login
// is all it leaves.
//
// It is deliberately minimal: a goroutine per connection, every reply
// encoded once at start and written with one write, no TLS (an SSLRequest is
// answered 'N'), no cancel requests (closed), no extended protocol (a FATAL
// error). Nothing in it is pgtender's server code, so a change to the pooler
// cannot move the ceiling.
package loginceiling

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
)

// Server serves logins on a listener until Close.
type Server struct {
	listener net.Listener
	// password, when not empty, is the only one accepted; any other is
	// refused with 28P01. Empty accepts any password.
	password []byte
	logins   atomic.Int64 // logins completed (AuthenticationOk sent)
	queries  atomic.Int64 // SELECT 1 answered
	accepts  sync.WaitGroup
}

// The replies, encoded once: a login on the ceiling costs reads and writes,
// not message encoding.
var (
	askPassword = encode(&pgproto3.AuthenticationCleartextPassword{})
	// loginOK follows the right password. The parameters are the ones
	// drivers read at login (pgx and libpq look at these); the backend key
	// is the same for every connection since cancel requests are not
	// served.
	loginOK = encode(
		&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "15.0 (loginceiling)"},
		&pgproto3.ParameterStatus{Name: "server_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "DateStyle", Value: "ISO, MDY"},
		&pgproto3.ParameterStatus{Name: "integer_datetimes", Value: "on"},
		&pgproto3.ParameterStatus{Name: "standard_conforming_strings", Value: "on"},
		&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{0, 0, 0, 1}},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	selectOne = encode(
		&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{
			{Name: []byte("?column?"), DataTypeOID: 23, DataTypeSize: 4, TypeModifier: -1},
		}},
		&pgproto3.DataRow{Values: [][]byte{[]byte("1")}},
		&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	emptyQuery = encode(&pgproto3.EmptyQueryResponse{}, &pgproto3.ReadyForQuery{TxStatus: 'I'})
	// otherQuery answers any query but SELECT 1: the ceiling runs nothing.
	otherQuery = encode(
		&pgproto3.ErrorResponse{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "0A000",
			Message: "loginceiling answers only SELECT 1"},
		&pgproto3.ReadyForQuery{TxStatus: 'I'},
	)
	wrongPassword = encode(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "28P01",
		Message: "password authentication failed"})
	unsupported = encode(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "0A000",
		Message: "loginceiling speaks only the simple query protocol"})
)

// encode concatenates the wire form of messages. The messages are fixed
// literals, so an error is a programming error.
func encode(messages ...pgproto3.BackendMessage) []byte {
	var out []byte
	for _, message := range messages {
		var err error
		if out, err = message.Encode(out); err != nil {
			panic(fmt.Sprintf("loginceiling: encoding %T: %v", message, err))
		}
	}
	return out
}

// Listen listens on addr (host:port; port 0 picks one) and serves logins in
// the background. Go's listener takes the kernel's net.core.somaxconn as its
// backlog, the largest a pooler's listen_backlog can be. TCP keepalive is
// off: it costs three setsockopt calls per accepted connection, and a
// ceiling should cost as little as a login can.
func Listen(addr, password string) (*Server, error) {
	listener, err := (&net.ListenConfig{KeepAlive: -1}).Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	server := &Server{listener: listener, password: []byte(password)}
	server.accepts.Go(server.acceptLoop)
	return server, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// Logins is the number of logins completed so far.
func (s *Server) Logins() int64 { return s.logins.Load() }

// Queries is the number of SELECT 1 answered so far.
func (s *Server) Queries() int64 { return s.queries.Load() }

// Close stops accepting and waits for the accept loop. Connections already
// accepted end when their clients leave (or when the process exits).
func (s *Server) Close() error {
	err := s.listener.Close()
	s.accepts.Wait()
	return err
}

func (s *Server) acceptLoop() {
	backoff := 5 * time.Millisecond
	for {
		conn, err := s.listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors, say: back off instead of spinning,
			// as a pooler does.
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		go s.serve(conn)
	}
}

// serve runs one connection: the login, then queries until Terminate or EOF.
// There is no deadline (a timer per login costs CPU the poolers' figures
// would be compared against): the load generator closes every connection
// within its own deadline, and the bench stops the process at the end.
func (s *Server) serve(conn net.Conn) {
	defer conn.Close()
	backend := pgproto3.NewBackend(conn, conn)
	if !s.login(conn, backend) {
		return
	}
	s.logins.Add(1)
	for {
		message, err := backend.Receive()
		if err != nil {
			return // EOF, a reset or a malformed message: the connection ends
		}
		var reply []byte
		switch message := message.(type) {
		case *pgproto3.Query:
			switch message.String {
			case "SELECT 1":
				s.queries.Add(1)
				reply = selectOne
			case "":
				reply = emptyQuery
			default:
				reply = otherQuery
			}
		case *pgproto3.Terminate:
			return
		default:
			_, _ = conn.Write(unsupported)
			return
		}
		if _, err := conn.Write(reply); err != nil {
			return
		}
	}
}

// login reads the startup packet, asks for a cleartext password and answers
// the login; false means the connection is to be closed.
func (s *Server) login(conn net.Conn, backend *pgproto3.Backend) bool {
	// An SSLRequest and a GSSENCRequest can each come once before the
	// StartupMessage; more is a broken client.
	for range 3 {
		message, err := backend.ReceiveStartupMessage()
		if err != nil {
			return false
		}
		switch message.(type) {
		case *pgproto3.SSLRequest, *pgproto3.GSSEncRequest:
			if _, err := conn.Write([]byte{'N'}); err != nil {
				return false
			}
			continue
		case *pgproto3.StartupMessage:
			return s.authenticate(conn, backend)
		default: // a CancelRequest: nothing to cancel
			return false
		}
	}
	return false
}

func (s *Server) authenticate(conn net.Conn, backend *pgproto3.Backend) bool {
	if _, err := conn.Write(askPassword); err != nil {
		return false
	}
	if err := backend.SetAuthType(pgproto3.AuthTypeCleartextPassword); err != nil {
		return false
	}
	message, err := backend.Receive()
	if err != nil {
		return false
	}
	password, ok := message.(*pgproto3.PasswordMessage)
	if !ok {
		_, _ = conn.Write(unsupported)
		return false
	}
	if len(s.password) > 0 && subtle.ConstantTimeCompare([]byte(password.Password), s.password) != 1 {
		_, _ = conn.Write(wrongPassword)
		return false
	}
	_, err = conn.Write(loginOK)
	return err == nil
}
