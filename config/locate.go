package config

import (
	"strconv"
	"strings"
)

// keyLines maps key paths ("general.port", "databases[1]",
// "databases[1].pool_size") to the 1-based line they are written on.
//
// BurntSushi/toml records positions only per dotted key, without the index
// of an [[array]] entry, and does not export them, so pgtender finds lines
// with this small scanner. It runs only on files the TOML parser accepted,
// and is written to never panic or loop on any input.
type keyLines map[string]int

// line returns the line of path, else of its closest written parent
// ("users[0].password" falls back to "users[0]", the entry's header), else 0.
func (kl keyLines) line(path string) int {
	for path != "" {
		if l, ok := kl[path]; ok {
			return l
		}
		var i int
		if strings.HasSuffix(path, "]") {
			i = strings.LastIndexByte(path, '[')
		} else {
			i = strings.LastIndexByte(path, '.')
		}
		if i < 0 {
			return 0
		}
		path = path[:i]
	}
	return 0
}

type lineScanner struct {
	src  string
	pos  int
	line int
}

// locateKeys scans a TOML document for table headers and keys.
// Keys inside inline tables are not recorded; their lines fall back to the
// key holding the inline table.
func locateKeys(src string) keyLines {
	s := &lineScanner{src: src, line: 1}
	lines := keyLines{}
	counts := map[string]int{}
	table := ""
	for {
		s.skipBlank()
		if s.eof() {
			return lines
		}
		start, startLine := s.pos, s.line
		if s.src[s.pos] == '[' {
			array := strings.HasPrefix(s.src[s.pos:], "[[")
			if array {
				s.pos += 2
			} else {
				s.pos++
			}
			table = s.key()
			if array {
				if _, seen := lines[table]; !seen {
					lines[table] = startLine // the array as a whole: its first entry
				}
				idx := counts[table]
				counts[table]++
				table += "[" + strconv.Itoa(idx) + "]"
			}
			if _, seen := lines[table]; !seen {
				lines[table] = startLine
			}
			s.skipLine()
		} else {
			k := s.key()
			if k != "" && !s.eof() && s.src[s.pos] == '=' {
				s.pos++
				path := k
				if table != "" {
					path = table + "." + k
				}
				lines[path] = startLine
				s.skipValue()
			} else {
				s.skipLine()
			}
		}
		if s.pos == start { // never stall on input the scanner does not understand
			s.advance()
		}
	}
}

func (s *lineScanner) eof() bool { return s.pos >= len(s.src) }

// advance consumes one byte, counting lines.
func (s *lineScanner) advance() {
	if s.src[s.pos] == '\n' {
		s.line++
	}
	s.pos++
}

// skipBlank skips whitespace, newlines and comments.
func (s *lineScanner) skipBlank() {
	for !s.eof() {
		switch s.src[s.pos] {
		case ' ', '\t', '\r', '\n':
			s.advance()
		case '#':
			s.skipComment()
		default:
			return
		}
	}
}

func (s *lineScanner) skipSpaces() {
	for !s.eof() && (s.src[s.pos] == ' ' || s.src[s.pos] == '\t') {
		s.pos++
	}
}

// skipComment skips to the end of the line, leaving the newline.
func (s *lineScanner) skipComment() {
	for !s.eof() && s.src[s.pos] != '\n' {
		s.pos++
	}
}

// skipLine skips the rest of a header line (or an unparsed line), leaving
// the newline.
func (s *lineScanner) skipLine() { s.skipComment() }

// key reads a dotted key (bare, "basic" or 'literal' parts) and the
// whitespace after it, returning the parts joined with ".".
func (s *lineScanner) key() string {
	var parts []string
	for {
		s.skipSpaces()
		if s.eof() {
			break
		}
		var part string
		switch c := s.src[s.pos]; {
		case c == '"':
			raw := s.basicString()
			if u, err := strconv.Unquote(raw); err == nil {
				part = u
			} else {
				part = strings.Trim(raw, `"`)
			}
		case c == '\'':
			part = strings.Trim(s.literalString(), "'")
		case isBareKeyChar(c):
			start := s.pos
			for !s.eof() && isBareKeyChar(s.src[s.pos]) {
				s.pos++
			}
			part = s.src[start:s.pos]
		default:
			return strings.Join(parts, ".")
		}
		parts = append(parts, part)
		s.skipSpaces()
		if s.eof() || s.src[s.pos] != '.' {
			break
		}
		s.pos++
	}
	return strings.Join(parts, ".")
}

func isBareKeyChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// basicString consumes a one-line "..." string with escapes and returns it
// with its quotes. It stops at a newline, which a valid one never contains.
func (s *lineScanner) basicString() string {
	start := s.pos
	s.pos++ // opening quote
	for !s.eof() {
		switch s.src[s.pos] {
		case '\\':
			s.pos++
			if !s.eof() && s.src[s.pos] != '\n' {
				s.pos++
			}
		case '"':
			s.pos++
			return s.src[start:s.pos]
		case '\n':
			return s.src[start:s.pos]
		default:
			s.pos++
		}
	}
	return s.src[start:s.pos]
}

// literalString consumes a one-line '...' string and returns it with its quotes.
func (s *lineScanner) literalString() string {
	start := s.pos
	s.pos++
	for !s.eof() && s.src[s.pos] != '\n' {
		if s.src[s.pos] == '\'' {
			s.pos++
			return s.src[start:s.pos]
		}
		s.pos++
	}
	return s.src[start:s.pos]
}

// multilineString consumes a multi-line string, opened and closed by three
// delim bytes (a double or a single quote). Up to two extra quotes after
// the closing three belong to the string, as TOML says.
func (s *lineScanner) multilineString(delim byte) {
	closing := strings.Repeat(string(delim), 3)
	s.pos += 3
	for !s.eof() {
		if delim == '"' && s.src[s.pos] == '\\' {
			s.advance()
			if !s.eof() {
				s.advance()
			}
			continue
		}
		if strings.HasPrefix(s.src[s.pos:], closing) {
			s.pos += 3
			for i := 0; i < 2 && !s.eof() && s.src[s.pos] == delim; i++ {
				s.pos++
			}
			return
		}
		s.advance()
	}
}

// skipValue consumes a value up to the end of its line, following arrays
// and inline tables across lines, and strings of every kind.
func (s *lineScanner) skipValue() {
	depth := 0
	for !s.eof() {
		switch c := s.src[s.pos]; c {
		case '\n':
			if depth == 0 {
				return
			}
			s.advance()
		case '#':
			s.skipComment()
		case '"', '\'':
			if strings.HasPrefix(s.src[s.pos:], strings.Repeat(string(c), 3)) {
				s.multilineString(c)
			} else if c == '"' {
				s.basicString()
			} else {
				s.literalString()
			}
		case '[', '{':
			depth++
			s.pos++
		case ']', '}':
			if depth > 0 {
				depth--
			}
			s.pos++
		default:
			s.pos++
		}
	}
}
