package wire

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseStartupOptions(t *testing.T) {
	cases := []struct {
		options string
		want    []Setting
	}{
		{"", nil},
		{"   \t ", nil},
		{"-c search_path=foo", []Setting{{"search_path", "foo"}}},
		{"-csearch_path=foo", []Setting{{"search_path", "foo"}}},
		{"--search_path=foo", []Setting{{"search_path", "foo"}}},
		{"--search-path=foo", []Setting{{"search_path", "foo"}}},
		{"-c search-path=a-b", []Setting{{"search_path", "a-b"}}}, // only the name's dashes
		{"-c search_path=foo -c statement_timeout=5s", []Setting{{"search_path", "foo"}, {"statement_timeout", "5s"}}},
		{"  -c\tsearch_path=foo\n--work_mem=64MB  ", []Setting{{"search_path", "foo"}, {"work_mem", "64MB"}}},
		{"-c application_name=my\\ app", []Setting{{"application_name", "my app"}}},
		{`-c search_path=a\\b`, []Setting{{"search_path", `a\b`}}},
		{`-c search_path=a\b`, []Setting{{"search_path", "ab"}}}, // a backslash makes any byte literal
		{`-c search_path=ab\`, []Setting{{"search_path", "ab"}}}, // a trailing backslash is dropped
		{`-c\ search_path=x`, []Setting{{" search_path", "x"}}},
		{"-c search_path=", []Setting{{"search_path", ""}}},
		{"-c a=b=c", []Setting{{"a", "b=c"}}},
		{"-c DateStyle=ISO", []Setting{{"DateStyle", "ISO"}}}, // names keep their case
		{"-c x=1 -c x=2", []Setting{{"x", "1"}, {"x", "2"}}},
		{"-B 128MB", []Setting{{"shared_buffers", "128MB"}}},
		{"-S 4MB", []Setting{{"work_mem", "4MB"}}},
		{"-e", []Setting{{"datestyle", "euro"}}},
		{"-F", []Setting{{"fsync", "false"}}},
		{"-Fe", []Setting{{"fsync", "false"}, {"datestyle", "euro"}}},
		{"-Fc work_mem=1MB", []Setting{{"fsync", "false"}, {"work_mem", "1MB"}}},
		{"-Fcwork_mem=1MB", []Setting{{"fsync", "false"}, {"work_mem", "1MB"}}},
		{"-fs -f hashjoin", []Setting{{"enable_seqscan", "false"}, {"enable_hashjoin", "false"}}},
		{"-t pa -t planner -t e", []Setting{{"log_parser_stats", "true"}, {"log_planner_stats", "true"}, {"log_executor_stats", "true"}}},
		{"-d 0", []Setting{{"log_min_messages", "notice"}}},
		{"-d 2", []Setting{{"log_min_messages", "debug2"}, {"log_statement", "all"}}},
		{"-d5", []Setting{
			{"log_min_messages", "debug5"}, {"log_statement", "all"}, {"debug_print_parse", "true"},
			{"debug_print_plan", "true"}, {"debug_print_rewritten", "true"},
		}},
		{"-d x", []Setting{{"log_min_messages", "notice"}}}, // atoi("x") is 0
		{"-i -l -O -P -s", []Setting{
			{"listen_addresses", "*"}, {"ssl", "true"}, {"allow_system_table_mods", "true"},
			{"ignore_system_indexes", "true"}, {"log_statement_stats", "true"},
		}},
		{"-h 0.0.0.0 -k /tmp -N 5 -p 5433 -W 10", []Setting{
			{"listen_addresses", "0.0.0.0"}, {"unix_socket_directories", "/tmp"},
			{"max_connections", "5"}, {"port", "5433"}, {"post_auth_delay", "10"},
		}},
		// Accepted and dropped, as a backend drops them from a client.
		{"-b -E -j -n -T -C x -D /data -r out -v 196608", nil},
		{"-c a=1 --", []Setting{{"a", "1"}}},
	}
	for _, tc := range cases {
		got, err := ParseStartupOptions(tc.options)
		if err != nil {
			t.Errorf("ParseStartupOptions(%q): %v", tc.options, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseStartupOptions(%q) = %q, want %q", tc.options, got, tc.want)
		}
	}
}

func TestParseStartupOptionsErrors(t *testing.T) {
	cases := []struct {
		options string
		mention string // the error names the offending switch or argument
	}{
		{"search_path=foo", `"search_path=foo"`},
		{"-c search_path=foo extra", `"extra"`},
		{"-", `"-"`},
		{"-X", "-X"},
		{"-Fx", "-x"},
		{"-A on", "-A"}, // removed from Postgres (it was debug_assertions)
		{"-o x", "-o"},
		{"-:", "-:"},
		{"-c", "-c requires an argument"},
		{"-c search_path", "-c search_path requires a value"},
		{"--search_path", "--search_path requires a value"},
		{"-c -F", "-c -F requires a value"},
		{"-B", "-B requires an argument"},
		{"-f x", "-f x"},
		{"-f", "-f requires an argument"},
		{"-t p", "-t p"},
		{"-t x", "-t x"},
		{"-- -c a=1", `"-c"`},
		{"-c\\ ", `-c   requires a value`},
	}
	for _, tc := range cases {
		got, err := ParseStartupOptions(tc.options)
		if err == nil {
			t.Errorf("ParseStartupOptions(%q) = %q, want an error", tc.options, got)
			continue
		}
		if !errors.Is(err, ErrInvalidStartupOptions) {
			t.Errorf("ParseStartupOptions(%q): %v does not wrap ErrInvalidStartupOptions", tc.options, err)
		}
		if !strings.Contains(err.Error(), tc.mention) {
			t.Errorf("ParseStartupOptions(%q): %q does not mention %q", tc.options, err, tc.mention)
		}
		if got != nil {
			t.Errorf("ParseStartupOptions(%q) returned %q with its error", tc.options, got)
		}
	}
}

// escapeStartupOption is the inverse of pg_split_opts for one argument.
func escapeStartupOption(arg string) string {
	var b strings.Builder
	for i := 0; i < len(arg); i++ {
		if isCSpace(arg[i]) || arg[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(arg[i])
	}
	return b.String()
}

func FuzzStartupOptions(f *testing.F) {
	for _, seed := range []string{
		"-c search_path=foo -c statement_timeout=5s",
		"--search-path=foo",
		`-c application_name=my\ app\\`,
		"-Fe -d 3 -fs -t pa -B 1MB",
		"-c",
		"-- x",
		"-X",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, options string) {
		settings, err := ParseStartupOptions(options)
		if err != nil {
			if !errors.Is(err, ErrInvalidStartupOptions) {
				t.Fatalf("%q: error %v does not wrap ErrInvalidStartupOptions", options, err)
			}
			return
		}
		// Written back as -c switches, the settings parse the same.
		var again []string
		for _, s := range settings {
			if strings.Contains(s.Name, "-") {
				t.Fatalf("%q: name %q keeps a dash", options, s.Name)
			}
			again = append(again, "-c", escapeStartupOption(s.Name+"="+s.Value))
		}
		reparsed, err := ParseStartupOptions(strings.Join(again, " "))
		if err != nil {
			t.Fatalf("%q: settings %q written back do not parse: %v", options, settings, err)
		}
		if len(reparsed) != len(settings) || (len(settings) > 0 && !reflect.DeepEqual(reparsed, settings)) {
			t.Fatalf("%q: settings %q written back parse as %q", options, settings, reparsed)
		}
	})
}

func BenchmarkParseStartupOptions(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseStartupOptions("-c search_path=app,public -c statement_timeout=5s --application-name=web"); err != nil {
			b.Fatal(err)
		}
	}
}
