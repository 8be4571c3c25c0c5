package admin

import (
	"bytes"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// readBackend decodes the messages of buf as a client reads them.
func readBackend(t *testing.T, buf []byte) []pgproto3.BackendMessage {
	t.Helper()
	frontend := pgproto3.NewFrontend(bytes.NewReader(buf), io.Discard)
	var out []pgproto3.BackendMessage
	for {
		msg, err := frontend.Receive()
		if err == io.ErrUnexpectedEOF || err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("decoding the result: %v", err)
		}
		// Receive reuses its messages: keep a copy of each.
		encoded, err := msg.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		copied := pgproto3.NewFrontend(bytes.NewReader(encoded), io.Discard)
		kept, err := copied.Receive()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, kept)
	}
}

func TestResultAppend(t *testing.T) {
	r := &Result{Columns: []Column{{"name", Text}, {"n4", Int4}, {"n8", Int8}, {"big", Numeric}, {"none", Text}}}
	r.Add("a", 1, int64(-2), uint64(1)<<63, nil)
	r.Add("", 0, int64(0), uint64(0), "x")
	msgs := readBackend(t, r.Append(nil, "SHOW"))
	if len(msgs) != 4 {
		t.Fatalf("%d messages, want RowDescription, 2 DataRows, CommandComplete: %#v", len(msgs), msgs)
	}
	desc, ok := msgs[0].(*pgproto3.RowDescription)
	if !ok || len(desc.Fields) != 5 {
		t.Fatalf("first message %#v", msgs[0])
	}
	for i, want := range []struct {
		name string
		oid  uint32
		size int16
	}{{"name", 25, -1}, {"n4", 23, 4}, {"n8", 20, 8}, {"big", 1700, -1}, {"none", 25, -1}} {
		f := desc.Fields[i]
		if string(f.Name) != want.name || f.DataTypeOID != want.oid || f.DataTypeSize != want.size || f.Format != 0 {
			t.Errorf("field %d = %+v, want %+v", i, f, want)
		}
	}
	row := msgs[1].(*pgproto3.DataRow)
	for i, want := range []string{"a", "1", "-2", "9223372036854775808"} {
		if string(row.Values[i]) != want {
			t.Errorf("value %d = %q, want %q", i, row.Values[i], want)
		}
	}
	if row.Values[4] != nil {
		t.Errorf("NULL came out as %q", row.Values[4])
	}
	if second := msgs[2].(*pgproto3.DataRow); string(second.Values[0]) != "" || second.Values[0] == nil {
		t.Errorf("an empty string came out as %#v, want empty, not NULL", second.Values[0])
	}
	if tag := msgs[3].(*pgproto3.CommandComplete); string(tag.CommandTag) != "SHOW" {
		t.Errorf("tag %q", tag.CommandTag)
	}
}

func TestResultAddChecksWidth(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("a row of the wrong width was accepted")
		}
	}()
	Version.NewResult().Add("a", "b")
}

// TestTablesStartWithPgBouncers checks each table's PgBouncer part against
// PgBouncer 1.25's column lists (src/admin.c), names and order; the
// integration test compares the types with a running PgBouncer.
func TestTablesStartWithPgBouncers(t *testing.T) {
	for name, tc := range map[string]struct {
		table *Table
		want  string
	}{
		"pools":     {Pools, "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us pool_mode load_balance_hosts"},
		"databases": {Databases, "name host port database force_user pool_size min_pool_size reserve_pool_size server_lifetime pool_mode load_balance_hosts max_connections current_connections max_client_connections current_client_connections paused disabled"},
		"users":     {Users, "name pool_size reserve_pool_size pool_mode max_user_connections current_connections max_user_client_connections current_client_connections"},
	} {
		var got []byte
		for i, c := range tc.table.PgBouncer {
			if i > 0 {
				got = append(got, ' ')
			}
			got = append(got, c.Name...)
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, tc.want)
		}
		if n := len(tc.table.Columns()); n != len(tc.table.PgBouncer)+len(tc.table.Own) {
			t.Errorf("%s: %d columns", name, n)
		}
	}
}
