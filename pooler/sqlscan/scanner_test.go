package sqlscan

import (
	"strings"
	"testing"
)

// scan classifies text in one piece.
func scan(text string, standardOff bool) Effects {
	s := Scanner{StandardConformingStringsOff: standardOff}
	s.Write([]byte(text))
	return s.Effects()
}

// scanPieces classifies text fed in the pieces that cuts (increasing
// offsets) make of it.
func scanPieces(text string, standardOff bool, cuts ...int) *Scanner {
	s := &Scanner{StandardConformingStringsOff: standardOff}
	last := 0
	for _, cut := range cuts {
		s.Write([]byte(text[last:cut]))
		last = cut
	}
	s.Write([]byte(text[last:]))
	return s
}

// checkEverySplit checks that every split of text in two, and feeding it a
// byte at a time, classifies it as the one piece does.
func checkEverySplit(t *testing.T, text string, standardOff bool) {
	t.Helper()
	want := scan(text, standardOff)
	for cut := 0; cut <= len(text); cut++ {
		if got := scanPieces(text, standardOff, cut).Effects(); got != want {
			t.Fatalf("%q split at %d: %v, in one piece %v", text, cut, got, want)
		}
	}
	cuts := make([]int, 0, len(text))
	for i := 1; i < len(text); i++ {
		cuts = append(cuts, i)
	}
	if got := scanPieces(text, standardOff, cuts...).Effects(); got != want {
		t.Fatalf("%q a byte at a time: %v, in one piece %v", text, got, want)
	}
}

type effectsCase struct {
	text string
	want Effects
}

var settingCases = []effectsCase{
	{"SET search_path = foo", SetsSetting},
	{"set search_path to foo", SetsSetting},
	{"SET SESSION search_path = foo", SetsSetting},
	{`SET "search_path" = foo`, SetsSetting},
	{"SET ROLE admin", SetsSetting},
	{"SET SESSION AUTHORIZATION bob", SetsSetting},
	{"SET TIME ZONE 'UTC'", SetsSetting},
	{"SET NAMES 'UTF8'", SetsSetting},
	{"SET SCHEMA 'app'", SetsSetting},
	{"SET XML OPTION DOCUMENT", SetsSetting},
	{"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE", SetsSetting},
	{"SET LOCAL search_path = foo", 0},
	{"set local statement_timeout = 5", 0},
	{`SET LOCAL "work_mem" = '1MB'`, 0},
	{"BEGIN; SET LOCAL work_mem = '64MB'; COMMIT", 0},
	{"SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", 0},
	{"SET CONSTRAINTS ALL DEFERRED", 0},
	// LOCAL is not reserved: here it begins the name of a custom setting.
	{"SET local.thing = 1", SetsSetting},
	{"SET LOCAL local.thing = 1", 0},
	{"RESET search_path", SetsSetting},
	{"reset role", SetsSetting},
	{"RESET SESSION AUTHORIZATION", SetsSetting},
	{"RESET ALL", ResetsAll},
	{"SELECT set_config('search_path', 'x', false)", SetsSetting},
	{"select pg_catalog.set_config('search_path', 'x', false)", SetsSetting},
	{`SELECT "set_config"('a', 'b', false)`, SetsSetting},
	{`SELECT "pg_catalog"."set_config"('a', 'b', false)`, SetsSetting},
	{"SELECT SET_CONFIG ('a', 'b', true)", SetsSetting},
	{"SELECT current_setting('search_path')", 0},
	{"UPDATE pg_settings SET setting = 'x' WHERE name = 'search_path'", SetsSetting},
	{"WITH u AS (UPDATE pg_catalog.pg_settings SET setting = 'x' WHERE name = 'y' RETURNING 1) SELECT 1", SetsSetting},
	{"SELECT name, setting FROM pg_settings", 0},
}

var sessionCases = []effectsCase{
	{"DISCARD ALL", DiscardAll | ResetsAll},
	{"discard plans", DiscardOther},
	{"DISCARD SEQUENCES", DiscardOther},
	{"DISCARD TEMP", DiscardOther},
	{"DISCARD TEMPORARY", DiscardOther},
	{"PREPARE q AS SELECT 1", Prepare},
	{"PREPARE q(int) AS SELECT $1", Prepare},
	{"PREPARE transaction AS SELECT 1", Prepare},
	{"PREPARE TRANSACTION 'gid1'", 0},
	{"PREPARE TRANSACTION $$gid1$$", 0},
	{"DEALLOCATE q", Deallocate},
	{"DEALLOCATE PREPARE q", Deallocate},
	{"DEALLOCATE ALL", Deallocate},
	{"LISTEN channel", Listen},
	{"UNLISTEN *", Unlisten},
	{"SELECT pg_advisory_lock(1)", AdvisoryLock},
	{"SELECT pg_advisory_lock_shared(1)", AdvisoryLock},
	{"SELECT pg_try_advisory_lock(1, 2)", AdvisoryLock},
	{"SELECT pg_try_advisory_lock_shared(1)", AdvisoryLock},
	{"SELECT pg_catalog.PG_ADVISORY_LOCK(1)", AdvisoryLock},
	{`SELECT "pg_advisory_lock"(1)`, AdvisoryLock},
	{"SELECT pg_advisory_xact_lock(1)", 0},
	{"SELECT pg_try_advisory_xact_lock_shared(1)", 0},
	{"SELECT pg_advisory_unlock(1)", AdvisoryUnlock},
	{"SELECT pg_advisory_unlock_shared(1)", AdvisoryUnlock},
	{"SELECT pg_advisory_unlock_all()", AdvisoryUnlock},
	{"CREATE TEMP TABLE t (x int)", TempObject},
	{"CREATE TEMPORARY VIEW v AS SELECT 1", TempObject},
	{"create temp sequence s", TempObject},
	{"CREATE LOCAL TEMP TABLE t ()", TempObject},
	{"CREATE GLOBAL TEMPORARY TABLE t ()", TempObject},
	{"CREATE OR REPLACE TEMP VIEW v AS SELECT 1", TempObject},
	{"CREATE OR REPLACE LOCAL TEMPORARY VIEW v AS SELECT 1", TempObject},
	{"CREATE TABLE pg_temp.t (x int)", TempObject},
	{`CREATE TABLE "pg_temp".t (x int)`, TempObject},
	{"SELECT * FROM pg_temp_3.t", TempObject},
	{"SELECT 1 INTO TEMP t", TempObject},
	{"SELECT * INTO TEMPORARY TABLE t FROM u", TempObject},
	{"SELECT * INTO LOCAL TEMP t FROM u", TempObject},
	{"SELECT * INTO t FROM u", 0},
	{"CREATE TABLE t (x int)", 0},
	{"CREATE UNLOGGED TABLE t ()", 0},
	{"CREATE OR REPLACE VIEW v AS SELECT 1", 0},
	{"DECLARE c CURSOR WITH HOLD FOR SELECT 1", HoldCursor},
	{"declare c binary no scroll cursor with hold for select 1", HoldCursor},
	{"DECLARE c SCROLL CURSOR WITHOUT HOLD FOR SELECT 1", 0},
	{"DECLARE c CURSOR FOR SELECT 1", 0},
	{"CLOSE c", CloseCursor},
	{"CLOSE ALL", CloseCursor},
	{"DO $$BEGIN PERFORM 1; END$$", DoBlock},
	{"DO LANGUAGE plpgsql 'BEGIN END'", DoBlock},
	{"DO $$ SET x = 1 $$", DoBlock},
	{"LOAD 'auto_explain'", LoadLibrary},
	{"EXPLAIN SELECT 1", 0},
	{"EXPLAIN ANALYZE CREATE TEMP TABLE t AS SELECT 1", TempObject},
	{"EXPLAIN (ANALYZE, BUFFERS (true)) CREATE TEMP TABLE t AS SELECT 1", TempObject},
	{"EXPLAIN ANALYSE VERBOSE DECLARE c CURSOR WITH HOLD FOR SELECT 1", HoldCursor},
	{"EXPLAIN ANALYZE SELECT set_config('a', 'b', false)", SetsSetting},
	{"(SELECT 1)", 0},
	{"((SELECT pg_advisory_lock(1)))", AdvisoryLock},
	{"SELECT 1; LISTEN a; SELECT pg_advisory_lock(2); SET x = 1", Listen | AdvisoryLock | SetsSetting},
}

// trapCases are texts where a keyword is where it does not count, or
// counts where a careless lexer would not see it.
var trapCases = []effectsCase{
	{"UPDATE t SET x = 1", 0},
	{"ALTER ROLE r SET search_path = x", 0},
	{"ALTER DATABASE d SET work_mem = '1MB'", 0},
	{"ALTER SYSTEM SET work_mem = '1MB'", 0},
	{"CREATE FUNCTION f() RETURNS int LANGUAGE sql SET search_path = x AS 'SELECT 1'", 0},
	{"INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET x = 1", 0},
	{"SELECT do_something(), setting, reset_count FROM settings", 0},
	{"SELECT 'SET x = 1'", 0},
	{"SELECT 'pg_advisory_lock(1)', 'pg_temp'", 0},
	{"SELECT 1 -- ; SET x = 1", 0},
	{"SELECT 1 -- \r SET x = 1", 0}, // one statement: the SET does not lead
	{"SELECT 1 --\n; SET x = 1", SetsSetting},
	{"SELECT 1 /* ; SET x = 1 */", 0},
	{"SELECT 1 /* /* nested */ ; SET x = 1 */", 0},
	{"SELECT 1 /* /* nested */ */; SET x = 1", SetsSetting},
	{"SELECT 1 /*/ ; SET x = 1 */", 0},
	{"SELECT 1 /**/; SET x = 1", SetsSetting},
	{"SELECT 1 /* **/; SET x = 1", SetsSetting},
	{"SELECT 2-/* c */-1; SET x = 1", SetsSetting},
	{"SELECT 2--1; SET x = 1", 0},
	{"SELECT $$ ; SET x = 1 $$", 0},
	{"SELECT $tag$ $$ ; SET x = 1 $tag$", 0},
	{"SELECT $tag$ x $tag$; SET x = 1", SetsSetting},
	{"SELECT $a$ $b$ $a$; SET x = 1", SetsSetting},
	{"SELECT $a$ $$a$; SET x = 1", SetsSetting},
	{"SELECT $A$ $a$ ; SET x = 1 $A$", 0}, // tags are case-sensitive
	{"SELECT $_$ ; SET x = 1 $_$", 0},
	{"SELECT $1; SET x = 1", SetsSetting},
	{"SELECT $1 $$; SET x = 1 $$", 0},
	{"SELECT $1$$; SET x = 1 $$", 0},
	{"SELECT a$$b; SET x = 1", SetsSetting}, // a$$b is one identifier
	{"SELECT a$b$ ; SET x = 1", SetsSetting},
	{"SELECT $x; SET y = 1", SetsSetting}, // $ then the identifier x
	{"SELECT $set_config", SetsSetting},
	{"SELECT $e'\\'; SET x = 1; --'", 0}, // $ then E'...'
	{"SELECT E'\\'; SET x = 1; --'", 0},
	{"SELECT e'\\\\'; SET x = 1", SetsSetting},
	{"SELECT '\\'; SET x = 1; --'", SetsSetting}, // standard_conforming_strings on: \ is literal
	{"SELECT 'it''s; SET x = 1'", 0},
	{"SELECT E'a''b; SET x = 1'", 0},
	{"SELECT '\\''; SET x = 1; --'", 0},
	{"SELECT U&'\\0041'; SET x = 1", SetsSetting},
	{"SELECT B'1', X'1F'; SET x = 1", SetsSetting},
	{"SELECT N'x'; SET x = 1", SetsSetting},
	{"SELECT some'x'; SET x = 1", SetsSetting},
	// Continuation: the second part of E'a' '...' across a newline takes
	// backslash escapes too, so the string ends at the last quote of '\''.
	{"SELECT E'a'\n'\\''; SET x = 1; --'", SetsSetting},
	{"SELECT E'a' \t\r\n  '\\''; SET x = 1; --'", SetsSetting},
	{"SELECT E'a' -- c\n'\\''; SET x = 1; --'", SetsSetting},
	{"SELECT E'a'\n-- c\n'\\''; SET x = 1; --'", SetsSetting},
	{"SELECT E'a' '\\''; SET x = 1; --'", 0},          // no newline: a new, standard string
	{"SELECT E'a' /* c */\n'\\''; SET x = 1; --'", 0}, // /* */ breaks a continuation
	{"SELECT E'a'\n-'b'; SET x = 1", SetsSetting},
	{"SELECT 'a'\n'b'; SET x = 1", SetsSetting},
	{`SELECT "x""; SET y = 1"`, 0},
	{`SELECT "a" ; SET y = 1`, SetsSetting},
	{"SELECT 1;SET x = 1", SetsSetting},
	{";;SET x = 1;;", SetsSetting},
	{"-- c\nSET x = 1", SetsSetting},
	{"/* c */SET x = 1", SetsSetting},
	{"\t\r\n\f\vSET x = 1", SetsSetting},
	{"SELECT * FROM t WHERE name = 'DO'", 0},
	{"SELECT 'a' FROM t\x00; SET x = 1", 0}, // the NUL ends the text
	{"SET x = 1\x00", SetsSetting},
	{"SELECT 1 FROM t WHERE a = 'x' || $$set_config$$", 0},
	{"SELECT 1 AS \"set_config\"", SetsSetting}, // a column alias: a cheap false positive
	{"SELECT '", 0}, // unterminated: nothing runs
	{"SELECT 1 /* SET x = 1", 0},
	{"SET", 0}, // a syntax error
	{`SELECT nu&"x"`, 0},
	{"SELECT u & 1", 0},
}

var uncertainCases = []effectsCase{
	{`SELECT U&"d\0061t"`, Uncertain},
	{`SELECT u&"x"`, Uncertain},
	{"SELECT $" + strings.Repeat("t", tagCap+1) + "$ x $" + strings.Repeat("t", tagCap+1) + "$", Uncertain},
}

func TestEffects(t *testing.T) {
	for _, group := range []struct {
		name  string
		cases []effectsCase
	}{
		{"settings", settingCases},
		{"session", sessionCases},
		{"traps", trapCases},
		{"uncertain", uncertainCases},
	} {
		t.Run(group.name, func(t *testing.T) {
			for _, tc := range group.cases {
				if got := scan(tc.text, false); got != tc.want {
					t.Errorf("%q: %v, want %v", tc.text, got, tc.want)
					continue
				}
				checkEverySplit(t, tc.text, false)
			}
		})
	}
}

func TestLongestTagThatFits(t *testing.T) {
	tag := strings.Repeat("t", tagCap)
	text := "SELECT $" + tag + "$ ; SET x = 1 $" + tag + "$; LISTEN c"
	if got := scan(text, false); got != Listen {
		t.Errorf("a %d-byte tag: %v, want Listen", tagCap, got)
	}
}

func TestStandardConformingStringsOff(t *testing.T) {
	for _, tc := range []effectsCase{
		{"SELECT '\\'; SET x = 1; --'", 0},
		{"SELECT 'a\\''; SET x = 1; --'", SetsSetting},
		{"SELECT '\\\\'; SET x = 1", SetsSetting},
		{"SELECT U&'\\'; SET x = 1", SetsSetting}, // never backslash escapes
		{"SELECT B'\\'; SET x = 1", SetsSetting},
		{"SELECT N'\\'; SET x = 1; --'", 0},
		// The continuation of a bit string is a bit string.
		{"SELECT B'1'\n'\\'; SET x = 1", SetsSetting},
	} {
		if got := scan(tc.text, true); got != tc.want {
			t.Errorf("%q with standard_conforming_strings off: %v, want %v", tc.text, got, tc.want)
			continue
		}
		checkEverySplit(t, tc.text, true)
	}
	var s Scanner
	s.StandardConformingStringsOff = true
	s.Write([]byte("SET x = 1"))
	s.Reset()
	if !s.StandardConformingStringsOff {
		t.Error("Reset forgot StandardConformingStringsOff")
	}
	if got := s.Effects(); got != 0 {
		t.Errorf("Reset kept effects: %v", got)
	}
}

func TestSingleDeallocate(t *testing.T) {
	long := strings.Repeat("a", 70)
	// 62 bytes and a two-byte character straddling byte 63.
	straddle := strings.Repeat("b", 62) + "é"
	cases := []struct {
		text string
		name string
		all  bool
		ok   bool
	}{
		{"DEALLOCATE foo", "foo", false, true},
		{"deallocate FOO", "foo", false, true},
		{`DEALLOCATE "FOO"`, "FOO", false, true},
		{`DEALLOCATE "a""b"`, `a"b`, false, true},
		{`DEALLOCATE "two words"`, "two words", false, true},
		{"DEALLOCATE PREPARE foo", "foo", false, true},
		{"DEALLOCATE prepare PREPARE", "prepare", false, true},
		{"DEALLOCATE prepare", "prepare", false, true},
		{"DEALLOCATE ALL", "", true, true},
		{"deallocate prepare all", "", true, true},
		{`DEALLOCATE "all"`, "all", false, true},
		{"DEALLOCATE foo;", "foo", false, true},
		{"  ;DEALLOCATE foo ; ; ", "foo", false, true},
		{"/* c */ DEALLOCATE foo -- c", "foo", false, true},
		{"DEALLOCATE s_1$x", "s_1$x", false, true},
		{"DEALLOCATE ÉTé", "Été", false, true}, // only ASCII folds
		{"DEALLOCATE foo\x00; SELECT 1", "foo", false, true},
		{"DEALLOCATE " + long, long[:63], false, true},
		{`DEALLOCATE "` + straddle + `"`, straddle[:62], false, true},
		{"DEALLOCATE foo; SELECT 1", "", false, false},
		{"SELECT 1; DEALLOCATE foo", "", false, false},
		{"DEALLOCATE s1; DEALLOCATE s2", "", false, false},
		{"DEALLOCATE foo bar", "", false, false},
		{"DEALLOCATE ALL foo", "", false, false},
		{"DEALLOCATE", "", false, false},
		{"DEALLOCATE select", "", false, false},
		{"DEALLOCATE verbose", "", false, false},
		{`DEALLOCATE ""`, "", false, false},
		{"DEALLOCATE a.b", "", false, false},
		{"DEALLOCATE 'foo'", "", false, false},
		{`DEALLOCATE U&"foo"`, "", false, false},
		{"SELECT 1", "", false, false},
		{"", "", false, false},
	}
	for _, tc := range cases {
		for cut := 0; cut <= len(tc.text); cut++ {
			name, all, ok := scanPieces(tc.text, false, cut).SingleDeallocate()
			if string(name) != tc.name || all != tc.all || ok != tc.ok {
				t.Errorf("%q split at %d: SingleDeallocate() = %q, %v, %v; want %q, %v, %v",
					tc.text, cut, name, all, ok, tc.name, tc.all, tc.ok)
				break
			}
		}
	}
}

func TestEffectsString(t *testing.T) {
	for _, tc := range []struct {
		e    Effects
		want string
	}{
		{0, "none"},
		{SetsSetting, "SetsSetting"},
		{DiscardAll | ResetsAll, "ResetsAll|DiscardAll"},
		{Uncertain | 1<<20, "Uncertain|0x100000"},
	} {
		if got := tc.e.String(); got != tc.want {
			t.Errorf("%d.String() = %q, want %q", uint32(tc.e), got, tc.want)
		}
	}
}

func TestEffectsGroups(t *testing.T) {
	for _, tc := range []struct {
		e                 Effects
		settings, session bool
	}{
		{0, false, false},
		{SetsSetting, true, false},
		{ResetsAll | DiscardAll, true, false},
		{Prepare, false, true},
		{Listen | AdvisoryLock, false, true},
		{Unlisten | AdvisoryUnlock | CloseCursor | Deallocate | DiscardOther, false, false},
		{DoBlock, true, true},
		{LoadLibrary, true, true},
		{Uncertain, true, true},
	} {
		if got := tc.e.MayChangeSettings(); got != tc.settings {
			t.Errorf("%v.MayChangeSettings() = %v", tc.e, got)
		}
		if got := tc.e.NeedsSession(); got != tc.session {
			t.Errorf("%v.NeedsSession() = %v", tc.e, got)
		}
	}
}

func TestWriteAfterEnd(t *testing.T) {
	var s Scanner
	s.Write([]byte("SELECT 1"))
	if got := s.Effects(); got != 0 {
		t.Fatalf("%v", got)
	}
	s.Write([]byte("; SET x = 1"))
	if got := s.Effects(); got != 0 {
		t.Errorf("Write after Effects counted: %v", got)
	}
}

func TestZeroAllocations(t *testing.T) {
	text := []byte("SELECT set_config('a', E'b\\'', false), set_config('app.x', $1, $2), \"Quoted\" FROM pg_temp.t /* c */ -- d\n; " +
		"DEALLOCATE \"S1\"; DO $x$ $x$; SET \"App\".tenant = 1; RESET app.y")
	var s Scanner
	allocs := testing.AllocsPerRun(100, func() {
		s.Reset()
		for i := range text {
			s.Write(text[i : i+1])
		}
		s.Effects()
		s.SingleDeallocate()
		for i := range s.NumCustomNames() {
			_ = s.CustomName(i)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per text", allocs)
	}
}

func BenchmarkScanPgbenchSelect(b *testing.B) {
	text := []byte("SELECT abalance FROM pgbench_accounts WHERE aid = 12345;")
	var s Scanner
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		s.Write(text)
		if s.Effects() != 0 {
			b.Fatal("flagged")
		}
	}
}

// BenchmarkScanInsert100KiB is a multi-row INSERT of about 100 KiB, fed in
// the 8 KiB pieces the relay reads.
func BenchmarkScanInsert100KiB(b *testing.B) {
	text := insertText(100 << 10)
	var s Scanner
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		s.Reset()
		for off := 0; off < len(text); off += 8 << 10 {
			s.Write(text[off:min(off+8<<10, len(text))])
		}
		if s.Effects() != 0 {
			b.Fatal("flagged")
		}
	}
}

func insertText(size int) []byte {
	b := []byte("INSERT INTO pgbench_history (tid, bid, aid, delta, mtime, filler) VALUES ")
	for i := 0; len(b) < size; i++ {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, "(12, 3, 45678, -4321, '2024-01-02 03:04:05.678+00', 'it''s filler text')"...)
	}
	return append(b, ';', 0)
}
