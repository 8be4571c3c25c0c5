package config

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Problem is one thing wrong with the configuration files.
type Problem struct {
	File    string // the path as given to Load
	Line    int    // 1-based; 0 when the problem has no single line (a missing key, a missing file)
	Key     string // key path, e.g. "general.port", "databases[1].pool_size", "users[0].database"; may be empty
	Message string
}

// String formats the problem as "pgdog.toml:12: general.port: must be between 1 and 65535".
func (p Problem) String() string {
	var b strings.Builder
	b.WriteString(p.File)
	if p.Line > 0 {
		fmt.Fprintf(&b, ":%d", p.Line)
	}
	b.WriteString(": ")
	if p.Key != "" {
		b.WriteString(p.Key)
		b.WriteString(": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ProblemList is the error Load returns: every problem found, in file and
// line order.
type ProblemList struct {
	Problems []Problem
}

// Error lists the problems, one per line.
func (l *ProblemList) Error() string {
	lines := make([]string, len(l.Problems))
	for i, p := range l.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// problems collects problems while a config is loaded.
type problems struct {
	list  []Problem
	order map[string]int // file → position, so the config file sorts before users.toml
	keyed map[string]bool
}

// add records a problem. A key gets one problem, the first: a value that
// could not be decoded is not reported again as missing or out of range.
func (ps *problems) add(file string, line int, key, format string, args ...any) {
	if key != "" {
		id := file + "\x00" + key
		if ps.keyed[id] {
			return
		}
		if ps.keyed == nil {
			ps.keyed = map[string]bool{}
		}
		ps.keyed[id] = true
	}
	ps.list = append(ps.list, Problem{File: file, Line: line, Key: key, Message: fmt.Sprintf(format, args...)})
}

// sorted returns the problems by file (in the order files were registered),
// line and key, keeping the order of problems that tie.
func (ps *problems) sorted() []Problem {
	out := slices.Clone(ps.list)
	slices.SortStableFunc(out, func(a, b Problem) int {
		return cmp.Or(
			cmp.Compare(ps.order[a.File], ps.order[b.File]),
			cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Key, b.Key),
		)
	})
	return out
}
