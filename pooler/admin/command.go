// Package admin is the admin console's protocol side: what an operator's
// query means (ParseCommand) and how a result is framed for the client
// (Result), as PgBouncer's console frames it, so that the exporters and
// scripts written against PgBouncer read pgtender's. It knows nothing of
// pools or sessions: the pooler fills the results.
package admin

import (
	"strings"
)

// Command is one console command: its verb, upper-cased ("SHOW",
// "RELOAD", "KILL_CLIENT"), and its argument, if any: a SHOW's subject
// lower-cased ("pools"), a database name as written (unquoted when it was
// in double quotes), a client id.
type Command struct {
	Verb string
	Arg  string
}

// SyntaxError is a query the console cannot parse: the client gets 42601
// with its message, and the session goes on.
type SyntaxError struct{ Query string }

func (e *SyntaxError) Error() string {
	return "invalid command '" + e.Query + "', use SHOW HELP;"
}

// ParseCommand parses a console query: a word, optionally one argument
// word, and an optional trailing semicolon, with any whitespace around
// them, case-insensitive, as PgBouncer's console reads it (admin.c,
// cmd_normal_rx: words are [0-9a-z_]+ or a double-quoted identifier).
// An empty query (nothing, or only a semicolon) returns the zero Command
// and no error: the caller answers it with EmptyQueryResponse. It checks
// only the shape; whether the verb exists is the caller's to say.
func ParseCommand(query string) (Command, error) {
	rest := strings.TrimSpace(query)
	if rest == "" || rest == ";" {
		return Command{}, nil
	}
	rest = strings.TrimSpace(strings.TrimSuffix(rest, ";"))
	verb, rest, ok := nextWord(rest)
	if !ok || verb == "" {
		return Command{}, &SyntaxError{Query: query}
	}
	cmd := Command{Verb: strings.ToUpper(verb)}
	if rest == "" {
		return cmd, nil
	}
	if cmd.Verb == "SET" && isSpace(rest[0]) {
		// PgBouncer's SET key = value (admin.c, cmd_set_word_rx and
		// cmd_set_str_rx): Arg is the rest as written.
		cmd.Arg = strings.TrimSpace(rest)
		return cmd, nil
	}
	if !isSpace(rest[0]) {
		return Command{}, &SyntaxError{Query: query}
	}
	arg, rest, ok := nextWord(strings.TrimLeft(rest, " \t\r\n"))
	if !ok || rest != "" {
		return Command{}, &SyntaxError{Query: query}
	}
	if cmd.Verb == "SHOW" {
		arg = strings.ToLower(arg)
	}
	cmd.Arg = arg
	return cmd, nil
}

// nextWord splits a leading word off s: a run of ASCII letters, digits and
// underscores, or a double-quoted identifier ("" inside stands for one ").
// It reports false when s starts with neither, or a quote is not closed.
func nextWord(s string) (word, rest string, ok bool) {
	if s == "" {
		return "", "", false
	}
	if s[0] == '"' {
		var b strings.Builder
		for i := 1; i < len(s); i++ {
			if s[i] != '"' {
				b.WriteByte(s[i])
				continue
			}
			if i+1 < len(s) && s[i+1] == '"' {
				b.WriteByte('"')
				i++
				continue
			}
			if b.Len() == 0 {
				return "", "", false
			}
			return b.String(), s[i+1:], true
		}
		return "", "", false
	}
	i := 0
	for i < len(s) && isWordByte(s[i]) {
		i++
	}
	if i == 0 {
		return "", "", false
	}
	return s[:i], s[i:], true
}

func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_'
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n'
}
