package integration

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
)

var (
	killTransactions = flag.Int("kill-transactions", 4000,
		"transactions TestRandomClientKills runs in all (issue 17 asks for 100000: make test-faults-full)")
	killSeed = flag.Uint64("kill-seed", 0, "seed of TestRandomClientKills's choices; 0: from the clock")
)

// killWorkers is how many clients TestRandomClientKills runs at once, over
// a pool of killPoolSize: most of the time some of them wait for a server
// connection.
const (
	killWorkers  = 24
	killPoolSize = 4
)

// killPoint is where a client of TestRandomClientKills vanishes (its socket
// closed with a reset, as when a process dies), or killNone.
type killPoint int

const (
	killNone           killPoint = iota
	killInStartup                // part of the startup packet sent
	killInAuth                   // the startup packet sent, the password not
	killAfterBegin               // in a transaction, nothing written yet
	killAfterInsert              // in a transaction that wrote a row
	killMidPipeline              // an extended-protocol batch sent, no reply read
	killMidCopy                  // COPY FROM STDIN under way, part of the data sent
	killWithCancel               // a long query running, a CancelRequest sent
	killWithoutReading           // a request sent, as the client may still be waiting for a server connection
	killPoints
)

var killPointNames = [...]string{"none", "startup", "auth", "after BEGIN", "after INSERT", "mid-pipeline", "mid-COPY", "with a cancel in flight", "request unread"}

// TestRandomClientKills runs killWorkers clients, which in all run
// -kill-transactions transactions, each of which inserts a row tagged with
// its client and sequence number and reads back, in the same transaction,
// the rows its transaction holds and its SET LOCAL setting: seeing another
// client's row or setting is a cross-client observation. One transaction in
// five is cut by its client vanishing at a random point (killPoint). At the
// end the table must hold exactly the rows of the transactions that
// committed, Postgres no transaction left open, and there must have been no
// cross-client observation.
func TestRandomClientKills(t *testing.T) {
	seed := *killSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("-kill-seed=%d -kill-transactions=%d, %d clients over a pool of %d", seed, *killTransactions, killWorkers, killPoolSize)
	tp := startPooler(t, poolerOptions{
		general: "passthrough_auth = \"enabled_plain\"\nrollback_timeout = 5000",
		pool:    "pool_size = " + itoa(killPoolSize),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	admin := direct(t, ctx)
	if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS kill_rows; CREATE TABLE kill_rows (owner text, seq int, txid bigint); GRANT ALL ON kill_rows TO "+appUser); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP TABLE IF EXISTS kill_rows") })

	var (
		done, crossClient, failures atomic.Int64
		kills                       [killPoints]atomic.Int64
		mu                          sync.Mutex
		committed                   = map[string]bool{}
		problems                    []string
		wg                          sync.WaitGroup
	)
	problem := func(counter *atomic.Int64, format string, args ...any) {
		counter.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	start := time.Now()
	for w := range killWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			owner := fmt.Sprintf("w%d", w)
			var conn *pgx.Conn
			defer func() {
				if conn != nil {
					conn.Close(context.Background())
				}
			}()
			for seq := 0; done.Add(1) <= int64(*killTransactions); seq++ {
				if ctx.Err() != nil {
					return
				}
				point := killNone
				if rng.IntN(5) == 0 {
					point = killPoint(1 + rng.IntN(int(killPoints)-1))
				}
				kills[point].Add(1)
				if point == killInStartup || point == killInAuth {
					if err := vanishDuringLogin(tp.addr, point, rng); err != nil {
						problem(&failures, "%s: a login killed in %s: %v", owner, killPointNames[point], err)
					}
					continue
				}
				if conn == nil {
					var err error
					if conn, err = tp.connectAs(ctx, appUser, appPassword, appDB); err != nil {
						problem(&failures, "%s: connect: %v", owner, err)
						return
					}
				}
				ok, err := killTransaction(ctx, conn, owner, seq, point)
				switch {
				case err == errCrossClient:
					problem(&crossClient, "%s transaction %d: %v", owner, seq, err)
				case err != nil:
					problem(&failures, "%s transaction %d (%s): %v", owner, seq, killPointNames[point], err)
				}
				if ok {
					mu.Lock()
					committed[fmt.Sprintf("%s/%d", owner, seq)] = true
					mu.Unlock()
				}
				if point != killNone || err != nil {
					vanish(conn)
					conn = nil
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, p := range problems {
		t.Error(p)
	}

	// Every killed client's session ends, and its transaction with it.
	eventually(t, 60*time.Second, "every client session to end", func() bool { return tp.ClientCount() == 0 })
	eventually(t, 60*time.Second, "Postgres to hold no transaction of the test open", func() bool {
		var open int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND datname = $2
			AND (state LIKE 'idle in transaction%' OR state = 'active')`, appUser, appDB).Scan(&open)
		if err != nil {
			t.Fatal(err)
		}
		return open == 0
	})
	rows, err := admin.Query(ctx, "SELECT owner || '/' || seq FROM kill_rows")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var strays int
	for _, key := range stored {
		if !committed[key] {
			strays++
			if strays <= 5 {
				t.Errorf("row %s is stored, but its transaction did not commit: a killed client's transaction was not rolled back", key)
			}
		}
	}
	if len(stored)-strays != len(committed) {
		t.Errorf("%d committed transactions, %d of their rows stored", len(committed), len(stored)-strays)
	}
	if n := crossClient.Load(); n != 0 {
		t.Errorf("%d cross-client observations", n)
	}
	var byPoint []string
	for p := killInStartup; p < killPoints; p++ {
		byPoint = append(byPoint, fmt.Sprintf("%s %d", killPointNames[p], kills[p].Load()))
	}
	t.Logf("%d transactions in %v: %d committed, %d cut by a kill (%s); %d cross-client observations, %d failures, %d stray rows, 0 transactions left open",
		*killTransactions, elapsed.Round(time.Millisecond), len(committed), int64(*killTransactions)-kills[killNone].Load(),
		strings.Join(byPoint, ", "), crossClient.Load(), failures.Load(), strays)
}

// errCrossClient: a transaction saw a row or a setting of another client's.
var errCrossClient = fmt.Errorf("saw another client's row or setting")

// killTransaction runs one transaction of the test on conn, vanishing at
// point. It reports whether the transaction committed.
func killTransaction(ctx context.Context, conn *pgx.Conn, owner string, seq int, point killPoint) (committed bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	switch point {
	case killMidPipeline:
		// BEGIN, the INSERT and a COMMIT in one extended-protocol batch,
		// sent whole; the client dies before reading a reply.
		fe := frontendOf(conn)
		fe.Send(&pgproto3.Query{String: "BEGIN"})
		fe.Send(&pgproto3.Parse{Query: "INSERT INTO kill_rows VALUES ($1, $2, txid_current())"})
		fe.Send(&pgproto3.Bind{Parameters: [][]byte{[]byte(owner), []byte(itoa(seq))}})
		fe.Send(&pgproto3.Execute{})
		fe.Send(&pgproto3.Sync{})
		return false, fe.Flush()
	case killWithoutReading:
		fe := frontendOf(conn)
		fe.Send(&pgproto3.Query{String: fmt.Sprintf("BEGIN; INSERT INTO kill_rows VALUES ('%s', %d, txid_current())", owner, seq)})
		return false, fe.Flush()
	}
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		return false, err
	}
	if point == killAfterBegin {
		return false, nil
	}
	if point == killMidCopy {
		fe := frontendOf(conn)
		fe.Send(&pgproto3.Query{String: "COPY kill_rows (owner, seq, txid) FROM STDIN"})
		if err := fe.Flush(); err != nil {
			return false, err
		}
		if _, err := receiveUntil[*pgproto3.CopyInResponse](fe); err != nil {
			return false, err
		}
		fe.Send(&pgproto3.CopyData{Data: fmt.Appendf(nil, "%s\t%d\t0\n", owner, seq)})
		return false, fe.Flush()
	}
	if point == killWithCancel {
		fe := frontendOf(conn)
		fe.Send(&pgproto3.Query{String: "SELECT pg_sleep(30)"})
		if err := fe.Flush(); err != nil {
			return false, err
		}
		return false, conn.PgConn().CancelRequest(ctx)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET LOCAL app.owner = '%s'", owner)); err != nil {
		return false, err
	}
	if _, err := conn.Exec(ctx, "INSERT INTO kill_rows VALUES ($1, $2, txid_current())", owner, seq); err != nil {
		return false, err
	}
	if point == killAfterInsert {
		return false, nil
	}
	var foreign, own int
	var setting string
	err = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE owner <> $1), count(*) FILTER (WHERE owner = $1 AND seq = $2),
		current_setting('app.owner') FROM kill_rows WHERE txid = txid_current()`, owner, seq).Scan(&foreign, &own, &setting)
	if err != nil {
		return false, err
	}
	if foreign != 0 || own != 1 || setting != owner {
		_, _ = conn.Exec(ctx, "ROLLBACK")
		return false, fmt.Errorf("%w: %d rows of others, %d of its own, app.owner %q", errCrossClient, foreign, own, setting)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return false, err
	}
	return true, nil
}

// frontendOf speaks the protocol directly on conn's socket, for requests
// pgx would wait on.
func frontendOf(conn *pgx.Conn) *pgproto3.Frontend {
	socket := conn.PgConn().Conn()
	return pgproto3.NewFrontend(socket, socket)
}

// receiveUntil reads messages until one of type T (or an error) arrives.
func receiveUntil[T pgproto3.BackendMessage](fe *pgproto3.Frontend) (T, error) {
	for {
		msg, err := fe.Receive()
		if err != nil {
			var zero T
			return zero, err
		}
		if m, ok := msg.(T); ok {
			return m, nil
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			var zero T
			return zero, fmt.Errorf("%s %s", e.Code, e.Message)
		}
	}
}

// vanish closes conn's socket with a reset, as a process that died would,
// without a Terminate.
func vanish(conn *pgx.Conn) {
	socket := conn.PgConn().Conn()
	if tcp, ok := socket.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = socket.Close()
	conn.Close(context.Background()) // its socket is gone: frees pgx's side only
}

// vanishDuringLogin opens a connection and dies in the middle of its login:
// part of the startup packet sent (killInStartup), or all of it and
// nothing of the password the pooler then asks for (killInAuth).
func vanishDuringLogin(addr string, point killPoint, rng *rand.Rand) error {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return err
	}
	tcp := conn.(*net.TCPConn)
	_ = tcp.SetLinger(0)
	defer tcp.Close()
	packet := startupPacket(appUser, appDB)
	if point == killInStartup {
		packet = packet[:1+rng.IntN(len(packet)-1)]
	}
	_, err = tcp.Write(packet)
	if point == killInAuth && err == nil {
		// Wait for the password request, so the kill is in the auth stage.
		_ = tcp.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = tcp.Read(make([]byte, 64))
	}
	return err
}
