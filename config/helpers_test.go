package config

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// minimalMain is the smallest pgdog.toml Load accepts.
const minimalMain = `
[[databases]]
name = "app"
`

// files writes pgdog.toml and, when users is not nil, users.toml into a
// temporary directory and returns their paths ("" for no users file).
func files(t testing.TB, main string, users *string) (string, string) {
	t.Helper()
	dir := t.TempDir()
	mainPath := filepath.Join(dir, "pgdog.toml")
	if err := os.WriteFile(mainPath, []byte(main), 0o600); err != nil {
		t.Fatal(err)
	}
	if users == nil {
		return mainPath, ""
	}
	usersPath := filepath.Join(dir, "users.toml")
	if err := os.WriteFile(usersPath, []byte(*users), 0o600); err != nil {
		t.Fatal(err)
	}
	return mainPath, usersPath
}

func ptr(s string) *string { return &s }

// mustLoad loads the documents and fails the test on any problem.
func mustLoad(t testing.TB, main string, users *string) *Config {
	t.Helper()
	c, err := Load(files(t, main, users))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

// loadProblems loads the documents and returns the problems, with File
// reduced to the base name.
func loadProblems(t testing.TB, main string, users *string) []Problem {
	t.Helper()
	c, err := Load(files(t, main, users))
	if err == nil {
		t.Fatalf("Load succeeded, want problems; config:\n%s", c.Redacted())
	}
	if c != nil {
		t.Errorf("Load returned a config with an error")
	}
	pl, ok := errors.AsType[*ProblemList](err)
	if !ok {
		t.Fatalf("Load error is %T, want *ProblemList", err)
	}
	out := make([]Problem, len(pl.Problems))
	for i, p := range pl.Problems {
		p.File = filepath.Base(p.File)
		out[i] = p
	}
	return out
}

// want is an expected problem: Message must contain msg.
type want struct {
	file string
	line int
	key  string
	msg  string
}

func (w want) matches(p Problem) bool {
	return p.File == w.file && p.Line == w.line && p.Key == w.key && strings.Contains(p.Message, w.msg)
}

// checkProblems asserts that got holds exactly the wanted problems, in order.
func checkProblems(t *testing.T, got []Problem, wants []want) {
	t.Helper()
	ok := len(got) == len(wants)
	for i := 0; ok && i < len(got); i++ {
		ok = wants[i].matches(got[i])
	}
	if ok {
		return
	}
	var b strings.Builder
	for _, p := range got {
		b.WriteString("\n\t" + p.String())
	}
	t.Errorf("problems:%s\nwant:", b.String())
	for _, w := range wants {
		t.Errorf("\t%s:%d: %s: …%s…", w.file, w.line, w.key, w.msg)
	}
}

// scramSecret builds a well-formed SCRAM-SHA-256 secret.
func scramSecret() string {
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$4096:" + b64([]byte("0123456789abcdef")) + "$" +
		b64([]byte(strings.Repeat("k", 32))) + ":" + b64([]byte(strings.Repeat("s", 32)))
}

const md5Secret = "md5" + "0123456789abcdef0123456789abcdef"

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }
