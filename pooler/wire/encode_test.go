package wire

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// receiveBackend decodes one backend message from b with pgproto3.Frontend
// and checks that it is all of b.
func receiveBackend(t *testing.T, b []byte) pgproto3.BackendMessage {
	t.Helper()
	r := bytes.NewReader(b)
	f := pgproto3.NewFrontend(r, nil)
	msg, err := f.Receive()
	if err != nil {
		t.Fatalf("pgproto3.Frontend.Receive(% x): %v", b, err)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left after %T", r.Len(), msg)
	}
	return msg
}

// receiveFrontend decodes one frontend message from b with pgproto3.Backend.
func receiveFrontend(t *testing.T, b []byte) pgproto3.FrontendMessage {
	t.Helper()
	r := bytes.NewReader(b)
	be := pgproto3.NewBackend(r, nil)
	msg, err := be.Receive()
	if err != nil {
		t.Fatalf("pgproto3.Backend.Receive(% x): %v", b, err)
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left after %T", r.Len(), msg)
	}
	return msg
}

// prefix is what every Append* call is given as dst, to check that it is
// kept and that lengths are computed from where the message starts.
const prefix = "already here"

func appended(t *testing.T, out []byte) []byte {
	t.Helper()
	if !strings.HasPrefix(string(out), prefix) {
		t.Fatalf("dst prefix lost: %q", out)
	}
	return out[len(prefix):]
}

func TestAppendErrorResponse(t *testing.T) {
	for _, tc := range []struct{ severity, code, message string }{
		{SeverityFatal, "08P01", "invalid startup packet"},
		{SeverityError, "53300", "sorry, too many clients already"},
		{SeverityFatal, "28P01", `password authentication failed for user "ünïcødé"`},
		{SeverityError, "XX000", ""},
	} {
		b := appended(t, AppendErrorResponse([]byte(prefix), tc.severity, tc.code, tc.message))
		msg, ok := receiveBackend(t, b).(*pgproto3.ErrorResponse)
		if !ok {
			t.Fatalf("decoded as %T", msg)
		}
		want := pgproto3.ErrorResponse{Severity: tc.severity, SeverityUnlocalized: tc.severity, Code: tc.code, Message: tc.message}
		if !reflect.DeepEqual(*msg, want) {
			t.Fatalf("decoded %+v, want %+v", *msg, want)
		}
	}
}

func TestAppendReadyForQuery(t *testing.T) {
	for _, status := range []byte{TxIdle, TxInBlock, TxFailed} {
		b := appended(t, AppendReadyForQuery([]byte(prefix), status))
		msg, ok := receiveBackend(t, b).(*pgproto3.ReadyForQuery)
		if !ok || msg.TxStatus != status {
			t.Fatalf("decoded %#v, want ReadyForQuery %q", msg, status)
		}
		if want := encode(t, &pgproto3.ReadyForQuery{TxStatus: status}); !bytes.Equal(b, want) {
			t.Fatalf("% x, pgproto3 encodes % x", b, want)
		}
	}
}

func TestAppendParameterStatus(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"server_version", "17.2"},
		{"application_name", ""},
		{"TimeZone", "Europe/Paris"},
		{"search_path", strings.Repeat("s", 5000)},
	} {
		b := appended(t, AppendParameterStatus([]byte(prefix), tc.name, tc.value))
		msg, ok := receiveBackend(t, b).(*pgproto3.ParameterStatus)
		if !ok || msg.Name != tc.name || msg.Value != tc.value {
			t.Fatalf("decoded %#v, want %s=%s", msg, tc.name, tc.value)
		}
		if want := encode(t, &pgproto3.ParameterStatus{Name: tc.name, Value: tc.value}); !bytes.Equal(b, want) {
			t.Fatalf("% x, pgproto3 encodes % x", b, want)
		}
	}
}

func TestAppendBackendKeyData(t *testing.T) {
	for _, tc := range []struct{ pid, secret uint32 }{{1, 2}, {0xffffffff, 0}, {0x01020304, 0xa0b0c0d0}} {
		b := appended(t, AppendBackendKeyData([]byte(prefix), tc.pid, tc.secret))
		msg, ok := receiveBackend(t, b).(*pgproto3.BackendKeyData)
		if !ok {
			t.Fatalf("decoded as %T", msg)
		}
		wantSecret := []byte{byte(tc.secret >> 24), byte(tc.secret >> 16), byte(tc.secret >> 8), byte(tc.secret)}
		if msg.ProcessID != tc.pid || !bytes.Equal(msg.SecretKey, wantSecret) {
			t.Fatalf("decoded pid %d secret % x, want %d % x", msg.ProcessID, msg.SecretKey, tc.pid, wantSecret)
		}
	}
}

func TestAppendAuthenticationOk(t *testing.T) {
	b := appended(t, AppendAuthenticationOk([]byte(prefix)))
	if msg, ok := receiveBackend(t, b).(*pgproto3.AuthenticationOk); !ok {
		t.Fatalf("decoded as %T", msg)
	}
	if want := encode(t, &pgproto3.AuthenticationOk{}); !bytes.Equal(b, want) {
		t.Fatalf("% x, pgproto3 encodes % x", b, want)
	}
}

func TestAppendNegotiateProtocolVersion(t *testing.T) {
	for _, tc := range []struct {
		minor   uint32
		options []string
	}{
		{0, nil},
		{0, []string{"_pq_.compression"}},
		{2, []string{"_pq_.a", "_pq_.b", ""}},
	} {
		b := appended(t, AppendNegotiateProtocolVersion([]byte(prefix), tc.minor, tc.options))
		msg, ok := receiveBackend(t, b).(*pgproto3.NegotiateProtocolVersion)
		if !ok {
			t.Fatalf("decoded as %T", msg)
		}
		if msg.NewestMinorProtocol != tc.minor || len(msg.UnrecognizedOptions) != len(tc.options) {
			t.Fatalf("decoded %+v, want minor %d options %q", msg, tc.minor, tc.options)
		}
		for i := range tc.options {
			if msg.UnrecognizedOptions[i] != tc.options[i] {
				t.Fatalf("option %d: %q, want %q", i, msg.UnrecognizedOptions[i], tc.options[i])
			}
		}
		if want := encode(t, &pgproto3.NegotiateProtocolVersion{NewestMinorProtocol: tc.minor, UnrecognizedOptions: tc.options}); !bytes.Equal(b, want) {
			t.Fatalf("% x, pgproto3 encodes % x", b, want)
		}
	}
}

func TestAppendQuery(t *testing.T) {
	for _, sql := range []string{"ROLLBACK", "DISCARD ALL", "", "SET application_name = 'x'"} {
		b := appended(t, AppendQuery([]byte(prefix), sql))
		msg, ok := receiveFrontend(t, b).(*pgproto3.Query)
		if !ok || msg.String != sql {
			t.Fatalf("decoded %#v, want Query %q", msg, sql)
		}
	}
}

func TestAppendCancelRequest(t *testing.T) {
	for _, secret := range [][]byte{{1, 2, 3, 4}, bytes.Repeat([]byte{0xee}, 32), bytes.Repeat([]byte{7}, 256)} {
		b := appended(t, AppendCancelRequest([]byte(prefix), 0xcafe, secret))

		// pgproto3's server side reads it as a CancelRequest...
		be := pgproto3.NewBackend(bytes.NewReader(b), nil)
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			t.Fatalf("%d-byte secret: pgproto3: %v", len(secret), err)
		}
		cr, ok := msg.(*pgproto3.CancelRequest)
		if !ok || cr.ProcessID != 0xcafe || !bytes.Equal(cr.SecretKey, secret) {
			t.Fatalf("%d-byte secret: pgproto3 decoded %#v", len(secret), msg)
		}
		if want := encode(t, &pgproto3.CancelRequest{ProcessID: 0xcafe, SecretKey: secret}); !bytes.Equal(b, want) {
			t.Fatalf("% x, pgproto3 encodes % x", b, want)
		}

		// ...and so does ours.
		s, err := ReadStartup(bytes.NewReader(b), nil)
		if err != nil {
			t.Fatalf("%d-byte secret: ReadStartup: %v", len(secret), err)
		}
		want := Startup{Kind: CancelRequest, CancelProcessID: 0xcafe, CancelSecret: secret}
		if !reflect.DeepEqual(s, want) {
			t.Fatalf("ReadStartup = %+v, want %+v", s, want)
		}
		if s2, err := ParseStartup(b[4:]); err != nil || !reflect.DeepEqual(s2, want) {
			t.Fatalf("ParseStartup = %+v, %v", s2, err)
		}
	}
}

// TestAppendSequence writes a whole login answer into one buffer, as the
// session does, and reads it back.
func TestAppendSequence(t *testing.T) {
	var b []byte
	b = AppendAuthenticationOk(b)
	b = AppendParameterStatus(b, "client_encoding", "UTF8")
	b = AppendParameterStatus(b, "server_version", "17.2")
	b = AppendBackendKeyData(b, 77, 88)
	b = AppendReadyForQuery(b, TxIdle)
	want := encode(t,
		&pgproto3.AuthenticationOk{},
		&pgproto3.ParameterStatus{Name: "client_encoding", Value: "UTF8"},
		&pgproto3.ParameterStatus{Name: "server_version", Value: "17.2"},
		&pgproto3.BackendKeyData{ProcessID: 77, SecretKey: []byte{0, 0, 0, 88}},
		&pgproto3.ReadyForQuery{TxStatus: TxIdle},
	)
	if !bytes.Equal(b, want) {
		t.Fatalf("% x\nwant % x", b, want)
	}
}

func TestAppendAllocs(t *testing.T) {
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendParameterStatus(buf[:0], "server_version", "17.2")
		b = AppendBackendKeyData(b, 1, 2)
		b = AppendReadyForQuery(b, TxIdle)
		b = AppendAuthenticationOk(b)
		b = AppendParseComplete(b)
		b = AppendBindComplete(b)
		b = AppendCloseComplete(b)
		b = AppendNoData(b)
		b = AppendEmptyQueryResponse(b)
		_ = AppendCommandComplete(b, "DEALLOCATE")
	})
	if allocs != 0 {
		t.Fatalf("Append* into a large enough buffer: %.1f allocs", allocs)
	}
}

func TestAppendExtendedReplies(t *testing.T) {
	for _, tc := range []struct {
		name   string
		append func([]byte) []byte
		want   pgproto3.BackendMessage
	}{
		{"ParseComplete", AppendParseComplete, &pgproto3.ParseComplete{}},
		{"BindComplete", AppendBindComplete, &pgproto3.BindComplete{}},
		{"CloseComplete", AppendCloseComplete, &pgproto3.CloseComplete{}},
		{"NoData", AppendNoData, &pgproto3.NoData{}},
		{"EmptyQueryResponse", AppendEmptyQueryResponse, &pgproto3.EmptyQueryResponse{}},
	} {
		b := appended(t, tc.append([]byte(prefix)))
		if got := receiveBackend(t, b); reflect.TypeOf(got) != reflect.TypeOf(tc.want) {
			t.Fatalf("%s decoded as %T", tc.name, got)
		}
		if want := encode(t, tc.want); !bytes.Equal(b, want) {
			t.Fatalf("%s: % x, pgproto3 encodes % x", tc.name, b, want)
		}
	}
}

func TestAppendCommandComplete(t *testing.T) {
	for _, tag := range []string{"DEALLOCATE", "DEALLOCATE ALL", "SELECT 1", "DISCARD ALL", ""} {
		b := appended(t, AppendCommandComplete([]byte(prefix), tag))
		msg, ok := receiveBackend(t, b).(*pgproto3.CommandComplete)
		if !ok || string(msg.CommandTag) != tag {
			t.Fatalf("decoded %#v, want CommandComplete %q", msg, tag)
		}
		if want := encode(t, &pgproto3.CommandComplete{CommandTag: []byte(tag)}); !bytes.Equal(b, want) {
			t.Fatalf("% x, pgproto3 encodes % x", b, want)
		}
	}
}

func TestAppendMessage(t *testing.T) {
	want := encode(t, &pgproto3.NotificationResponse{PID: 42, Channel: "jobs", Payload: "hello"})
	b := appended(t, AppendMessage([]byte(prefix), want[0], want[HeaderLen:]))
	if !bytes.Equal(b, want) {
		t.Fatalf("% x, want % x", b, want)
	}
}
