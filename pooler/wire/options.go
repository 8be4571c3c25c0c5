package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Setting is one setting a startup packet's options parameter asks for.
type Setting struct{ Name, Value string }

// ErrInvalidStartupOptions is wrapped by every error ParseStartupOptions
// returns. Postgres refuses such a login with FATAL, SQLSTATE 42601
// (syntax_error), "invalid command-line argument for server process".
var ErrInvalidStartupOptions = errors.New("invalid command-line argument for server process")

// backendSwitches is the getopt string of the backend's own switches
// (process_postgres_switches in src/backend/tcop/postgres.c): a letter
// followed by ':' takes an argument.
const backendSwitches = "B:bC:c:D:d:EeFf:h:ijk:lN:nOPp:r:S:sTt:v:W:-:"

// ParseStartupOptions parses the options startup parameter the way a
// Postgres backend does: split into arguments by pg_split_opts
// (src/backend/utils/init/postinit.c), then read as the backend's
// command-line switches by process_postgres_switches. It returns the
// settings in the order given; a later one for the same name wins, as it
// does in Postgres.
//
// -c name=value, -cname=value and --name=value set name, whose dashes
// become underscores (ParseLongOption in src/backend/utils/misc/guc.c).
// The other switches that set something map to the setting Postgres maps
// them to (-B shared_buffers, -d N log_min_messages and friends, -e
// datestyle, -F fsync, -f X enable_X, -S work_mem, -t X log_X_stats, ...);
// those a client's options may not use (-D, -E, -j, -r, -v, -b) and those
// Postgres ignores (-C, -n, -T) are accepted and dropped, as Postgres drops
// them.
//
// Names and values are not checked here: Postgres checks them when it
// applies them, refusing an unknown name with 42704 and a bad value with
// 22023 (or a setting a client may not change at connection start with
// 55P02 or 42501). An error here is about the switches themselves: an
// unknown switch, a missing argument, -c without '=', or an argument that
// is not a switch.
func ParseStartupOptions(options string) ([]Setting, error) {
	args := splitStartupOptions(options)
	var settings []Setting
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			// getopt's end of switches: anything after it is an argument
			// the backend does not accept.
			if i+1 < len(args) {
				return nil, fmt.Errorf("%w: %q", ErrInvalidStartupOptions, args[i+1])
			}
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			return nil, fmt.Errorf("%w: %q is not a switch", ErrInvalidStartupOptions, arg)
		}
		// Switches may be grouped (-Fe), and the last may take its argument
		// from the rest of the word or from the next one.
		for j := 1; j < len(arg); j++ {
			letter := arg[j]
			takesArgument, known := switchTakesArgument(letter)
			if !known {
				return nil, fmt.Errorf("%w: %q: unknown switch -%c", ErrInvalidStartupOptions, arg, letter)
			}
			if !takesArgument {
				settings = appendSwitchSettings(settings, letter)
				continue
			}
			var value string
			switch {
			case j+1 < len(arg):
				value = arg[j+1:]
			case i+1 < len(args):
				i++
				value = args[i]
			default:
				return nil, fmt.Errorf("%w: %q: switch -%c requires an argument", ErrInvalidStartupOptions, arg, letter)
			}
			var err error
			if settings, err = appendSwitchArgumentSettings(settings, letter, value); err != nil {
				return nil, err
			}
			break
		}
	}
	return settings, nil
}

// splitStartupOptions is pg_split_opts: arguments are separated by
// whitespace, and a backslash makes the next byte literal, a space or a
// backslash included. A backslash at the very end is dropped.
func splitStartupOptions(options string) []string {
	var args []string
	var arg strings.Builder
	for i := 0; i < len(options); {
		for i < len(options) && isCSpace(options[i]) {
			i++
		}
		if i == len(options) {
			break
		}
		arg.Reset()
		escaped := false
		for ; i < len(options); i++ {
			c := options[i]
			if !escaped && isCSpace(c) {
				break
			}
			if !escaped && c == '\\' {
				escaped = true
				continue
			}
			escaped = false
			arg.WriteByte(c)
		}
		args = append(args, arg.String())
	}
	return args
}

// isCSpace is C's isspace in the C locale.
func isCSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\v', '\f', '\r':
		return true
	}
	return false
}

func switchTakesArgument(letter byte) (takesArgument, known bool) {
	if letter == ':' {
		return false, false
	}
	i := strings.IndexByte(backendSwitches, letter)
	if i < 0 {
		return false, false
	}
	return i+1 < len(backendSwitches) && backendSwitches[i+1] == ':', true
}

// appendSwitchSettings adds what a switch without an argument sets.
func appendSwitchSettings(settings []Setting, letter byte) []Setting {
	switch letter {
	case 'e':
		return append(settings, Setting{"datestyle", "euro"})
	case 'F':
		return append(settings, Setting{"fsync", "false"})
	case 'i':
		return append(settings, Setting{"listen_addresses", "*"})
	case 'l':
		return append(settings, Setting{"ssl", "true"})
	case 'O':
		return append(settings, Setting{"allow_system_table_mods", "true"})
	case 'P':
		return append(settings, Setting{"ignore_system_indexes", "true"})
	case 's':
		return append(settings, Setting{"log_statement_stats", "true"})
	}
	// b, E, j: only for the postmaster's own command line; n, T: ignored.
	return settings
}

// appendSwitchArgumentSettings adds what a switch with an argument sets.
func appendSwitchArgumentSettings(settings []Setting, letter byte, value string) ([]Setting, error) {
	switch letter {
	case 'c', '-':
		name, settingValue, ok := strings.Cut(value, "=")
		if !ok {
			if letter == '-' {
				return nil, fmt.Errorf("%w: --%s requires a value", ErrInvalidStartupOptions, value)
			}
			return nil, fmt.Errorf("%w: -c %s requires a value", ErrInvalidStartupOptions, value)
		}
		return append(settings, Setting{strings.ReplaceAll(name, "-", "_"), settingValue}), nil
	case 'B':
		return append(settings, Setting{"shared_buffers", value}), nil
	case 'd':
		return appendDebugSettings(settings, atoi(value)), nil
	case 'f':
		name, ok := planDisablingSetting(value)
		if !ok {
			return nil, fmt.Errorf("%w: -f %s: not one of s, i, o, b, t, n, m, h", ErrInvalidStartupOptions, value)
		}
		return append(settings, Setting{name, "false"}), nil
	case 'h':
		return append(settings, Setting{"listen_addresses", value}), nil
	case 'k':
		return append(settings, Setting{"unix_socket_directories", value}), nil
	case 'N':
		return append(settings, Setting{"max_connections", value}), nil
	case 'p':
		return append(settings, Setting{"port", value}), nil
	case 'S':
		return append(settings, Setting{"work_mem", value}), nil
	case 't':
		name, ok := statsSetting(value)
		if !ok {
			return nil, fmt.Errorf("%w: -t %s: not one of pa[rser], pl[anner], e[xecutor]", ErrInvalidStartupOptions, value)
		}
		return append(settings, Setting{name, "true"}), nil
	case 'W':
		return append(settings, Setting{"post_auth_delay", value}), nil
	}
	// C: ignored; D, r, v: only for the postmaster's own command line.
	return settings, nil
}

// appendDebugSettings is set_debug_options (postgres.c) for a client's
// switches, which do not get the log_connections of -d on the command line.
func appendDebugSettings(settings []Setting, level int) []Setting {
	if level > 0 {
		settings = append(settings, Setting{"log_min_messages", "debug" + strconv.Itoa(level)})
	} else {
		settings = append(settings, Setting{"log_min_messages", "notice"})
	}
	for _, step := range []struct {
		level int
		name  string
		value string
	}{
		{2, "log_statement", "all"},
		{3, "debug_print_parse", "true"},
		{4, "debug_print_plan", "true"},
		{5, "debug_print_rewritten", "true"},
	} {
		if level >= step.level {
			settings = append(settings, Setting{step.name, step.value})
		}
	}
	return settings
}

// planDisablingSetting is set_plan_disabling_options (postgres.c): the
// first letter of the argument picks the plan type.
func planDisablingSetting(value string) (string, bool) {
	if value == "" {
		return "", false
	}
	switch value[0] {
	case 's':
		return "enable_seqscan", true
	case 'i':
		return "enable_indexscan", true
	case 'o':
		return "enable_indexonlyscan", true
	case 'b':
		return "enable_bitmapscan", true
	case 't':
		return "enable_tidscan", true
	case 'n':
		return "enable_nestloop", true
	case 'm':
		return "enable_mergejoin", true
	case 'h':
		return "enable_hashjoin", true
	}
	return "", false
}

// statsSetting is get_stats_option_name (postgres.c), which looks at the
// first one or two letters only.
func statsSetting(value string) (string, bool) {
	switch {
	case strings.HasPrefix(value, "pa"):
		return "log_parser_stats", true
	case strings.HasPrefix(value, "pl"):
		return "log_planner_stats", true
	case strings.HasPrefix(value, "e"):
		return "log_executor_stats", true
	}
	return "", false
}

// atoi is C's atoi: optional leading whitespace and sign, then as many
// digits as there are; 0 when there are none. It saturates where C's
// behaviour is undefined.
func atoi(s string) int {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	negative := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		negative = s[i] == '-'
		i++
	}
	n := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		if n < 1<<31 {
			n = n*10 + int(s[i]-'0')
		}
	}
	n = min(n, 1<<31-1)
	if negative {
		return -n
	}
	return n
}
