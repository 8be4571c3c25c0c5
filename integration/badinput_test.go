package integration

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgtender/pgtender/pooler"
)

// Bad input from logged-in clients, each class tried many times with a
// bystander running queries throughout: every bad client gets FATAL 08P01
// and a closed connection, the class is counted, and the bystander, the
// pool and Postgres notice nothing.

const badInputMaxMessageSize = 64 << 10

// badInputCase is one class of bad input: what to send after login, and
// who must refuse it.
type badInputCase struct {
	name  string
	tries int
	// input returns the bytes of one try.
	input func(r *rand.Rand) []byte
	// message is part of the error text the client must get.
	message string
}

// Frontend message types a client may send after login (Postgres's
// postgres.c, SocketBackend): any other is garbage.
const frontendTypes = "BCdcfDEHFPQSX"

func header(typ byte, length uint32) []byte {
	return binary.BigEndian.AppendUint32([]byte{typ}, length)
}

func randomFrontendType(r *rand.Rand) byte { return frontendTypes[r.IntN(len(frontendTypes))] }

func badInputCases() []badInputCase {
	return []badInputCase{
		{
			name: "over max_message_size", tries: 100,
			input: func(r *rand.Rand) []byte {
				// Only the header: pgtender must refuse before the body.
				return header(randomFrontendType(r), uint32(badInputMaxMessageSize+1+r.IntN(1<<30-badInputMaxMessageSize)))
			},
			message: "max_message_size",
		},
		{
			name: "length word under 4", tries: 100,
			input: func(r *rand.Rand) []byte {
				return append(header(randomFrontendType(r), uint32(r.IntN(4))), make([]byte, r.IntN(16))...)
			},
			message: "invalid message from client",
		},
		{
			name: "length word over 1 GiB", tries: 100,
			input: func(r *rand.Rand) []byte {
				return header(randomFrontendType(r), uint32(1<<30+1+r.Int64N(1<<32-1<<30-1)))
			},
			message: "invalid message from client",
		},
		{
			name: "unknown message type", tries: 100,
			input: func(r *rand.Rand) []byte {
				var typ byte
				for typ == 0 || strings.IndexByte(frontendTypes, typ) >= 0 {
					typ = byte(r.IntN(256))
				}
				body := make([]byte, r.IntN(64))
				for i := range body {
					body[i] = byte(r.IntN(256))
				}
				return append(header(typ, uint32(4+len(body))), body...)
			},
			message: "invalid frontend message type",
		},
	}
}

// TestBadInputAfterLogin runs every class of badInputCases against a real
// Postgres in transaction mode, half the tries inside a transaction (the
// client holds a server connection) and half outside.
func TestBadInputAfterLogin(t *testing.T) {
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nmax_message_size = " + itoa(badInputMaxMessageSize),
		pool:    "pool_size = 4",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The bystander: a client running queries the whole time, bounded by
	// count and by the test's end.
	bystander := tp.connect(t, ctx)
	var bystanderQueries, bystanderErrors atomic.Int64
	var firstBystanderError atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			var got int
			if err := bystander.QueryRow(ctx, "SELECT $1::int", i).Scan(&got); err != nil || got != i {
				bystanderErrors.Add(1)
				firstBystanderError.CompareAndSwap(nil, err)
				return
			}
			bystanderQueries.Add(1)
		}
	}()

	r := rand.New(rand.NewPCG(17, 1))
	var want pooler.ClientProtocolErrors
	tried := map[string]int{}
	for _, c := range badInputCases() {
		for try := range c.tries {
			inTransaction := try%2 == 1
			input := c.input(r)
			code, message, err := sendBadInput(t, ctx, tp, input, inTransaction)
			if err != nil {
				t.Fatalf("%s, try %d (in a transaction: %v), input % x: %v", c.name, try, inTransaction, input[:min(len(input), 16)], err)
			}
			if code != "08P01" || !strings.Contains(message, c.message) {
				t.Fatalf("%s, try %d (in a transaction: %v): got %q %q, want FATAL 08P01 with %q", c.name, try, inTransaction, code, message, c.message)
			}
			tried[c.name]++
		}
		switch c.message {
		case "max_message_size":
			want.TooLarge += uint64(c.tries)
		case "invalid frontend message type":
			want.UnknownType += uint64(c.tries)
		default:
			want.Malformed += uint64(c.tries)
		}
	}
	close(stop)
	wg.Wait()
	if n := bystanderErrors.Load(); n != 0 {
		t.Fatalf("the bystander got an error after %d queries: %v", bystanderQueries.Load(), firstBystanderError.Load())
	}

	// A message at the bound passes: a simple Query of exactly
	// max_message_size, and one byte more is refused.
	atBound := tp.connect(t, ctx)
	prefix, suffix := "SELECT length('", "')"
	text := strings.Repeat("x", badInputMaxMessageSize-4-1-len(prefix)-len(suffix)) // length word, text, NUL
	var n int
	if err := atBound.QueryRow(ctx, prefix+text+suffix, pgx.QueryExecModeSimpleProtocol).Scan(&n); err != nil || n != len(text) {
		t.Fatalf("a query of exactly max_message_size: %v (length %d)", err, n)
	}
	err := atBound.QueryRow(ctx, prefix+text+"x"+suffix, pgx.QueryExecModeSimpleProtocol).Scan(&n)
	if code := sqlState(err); code != "08P01" {
		t.Fatalf("a query one byte over max_message_size: %v, want 08P01", err)
	}
	want.TooLarge++
	if got := tp.ClientProtocolErrors(); got != want {
		t.Errorf("client_protocol_errors_total = %+v, want %+v", got, want)
	}

	// Nothing was left behind: no backend idle in a transaction, and no
	// more backends than the pool holds.
	admin := direct(t, ctx)
	eventually(t, 20*time.Second, "Postgres to hold only the pool's connections, none in a transaction", func() bool {
		var backends, inTransaction int
		err := admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state LIKE 'idle in transaction%')
			FROM pg_stat_activity WHERE usename = $1 AND datname = $2`, appUser, appDB).Scan(&backends, &inTransaction)
		if err != nil {
			t.Fatal(err)
		}
		return inTransaction == 0 && backends <= 4 && backends == appPoolStats(t, tp).ServersTotal
	})
	t.Logf("bad inputs tried: %v; bystander queries meanwhile: %d, errors: 0; counters %+v",
		tried, bystanderQueries.Load(), tp.ClientProtocolErrors())
}

// sendBadInput logs a client in (and, if asked, opens a transaction, so it
// holds a server connection), sends input on its socket and returns the
// SQLSTATE and message of the error it then reads, after checking that the
// connection is closed after it.
func sendBadInput(t *testing.T, ctx context.Context, tp *testPooler, input []byte, inTransaction bool) (code, message string, err error) {
	t.Helper()
	client := tp.connect(t, ctx)
	if inTransaction {
		if _, err := client.Exec(ctx, "BEGIN; SELECT 1"); err != nil {
			t.Fatal(err)
		}
	}
	socket := client.PgConn().Conn()
	_ = socket.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := socket.Write(input); err != nil {
		t.Fatalf("writing the bad input: %v", err)
	}
	frontend := pgproto3.NewFrontend(socket, socket)
	for {
		msg, err := frontend.Receive()
		if err != nil {
			return "", "", fmt.Errorf("no error before the connection ended: %w", err)
		}
		e, ok := msg.(*pgproto3.ErrorResponse)
		if !ok {
			continue // a ParameterStatus, a NoticeResponse
		}
		if e.Severity != "FATAL" {
			return "", "", fmt.Errorf("got %s %s %q, want a FATAL error", e.Severity, e.Code, e.Message)
		}
		code, message = e.Code, e.Message
		break
	}
	if _, err := socket.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		return "", "", fmt.Errorf("after the FATAL error the connection is still open: read %w", err)
	}
	return code, message, nil
}

func isReset(err error) bool {
	var opErr *net.OpError
	return errors.As(err, &opErr) && strings.Contains(opErr.Err.Error(), "reset")
}

// TestMaxClientConnections: with max_client_connections reached, each
// further client gets FATAL 53300 at login, and the clients already
// connected notice nothing; once one leaves, the next is let in.
func TestMaxClientConnections(t *testing.T) {
	const limit, refusedTries = 5, 50
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nmax_client_connections = " + itoa(limit),
		pool:    "pool_size = 2",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var connected []*pgx.Conn
	for range limit {
		connected = append(connected, tp.connect(t, ctx))
	}
	for try := range refusedTries {
		_, err := tp.connectAs(ctx, appUser, appPassword, appDB)
		if code := sqlState(err); code != "53300" || !strings.Contains(errorMessage(err), "max_client_connections") {
			t.Fatalf("client %d over max_client_connections: %v, want FATAL 53300", try, err)
		}
		// The connected clients carry on, each on its own session.
		c := connected[try%limit]
		var got int
		if err := c.QueryRow(ctx, "SELECT $1::int", try).Scan(&got); err != nil || got != try {
			t.Fatalf("a connected client, after refusal %d: %v (%d)", try, err, got)
		}
	}
	connected[0].Close(ctx)
	eventually(t, 10*time.Second, "a client to be let in once one left", func() bool {
		c, err := tp.connectAs(ctx, appUser, appPassword, appDB)
		if err != nil {
			return false
		}
		c.Close(ctx)
		return true
	})
	t.Logf("%d clients over max_client_connections = %d refused with 53300; the %d connected ran a query after each", refusedTries, limit, limit)
}
