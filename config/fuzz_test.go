package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoad writes arbitrary bytes as pgdog.toml and users.toml and loads
// them: Load must never panic, and must return exactly one of a config or
// a non-empty problem list.
func FuzzLoad(f *testing.F) {
	seeds := [][2]string{
		{minimalMain, ""},
		{"[general]\nport = \"x\"\n[[databases]]\nname = \"a\"\nrole = \"replica\"\n", "[[users]]\nname = \"u\"\ndatabase = \"a\"\n"},
		{"databases = [{ name = \"a\", pool_size = 0 }, 1]\n[admin]\npassword = \"SCRAM-SHA-256$1:$:\"\n", "[admin]\nname = 1\nusers = 3\n"},
		{"[general]\nmax_pool_size = 3\ndefault_pool_size = 4\nx = \"\"\"\n[[databases]]\n\"\"\"\n", "[[users]]\n[[users]]\nname = \"\"\n"},
		{"[[databases]\n", "users = 1"},
		{"a.b.c = 1\n[general.sub]\nk = 'v'\n[[databases]]\nname = \"d\"\n[[databases.x]]\n", "\xff\xfe"},
	}
	if data, err := os.ReadFile("../pgdog.toml.example"); err == nil {
		users, _ := os.ReadFile("../users.toml.example")
		seeds = append(seeds, [2]string{string(data), string(users)})
	}
	for _, s := range seeds {
		f.Add([]byte(s[0]), []byte(s[1]))
	}
	f.Fuzz(func(t *testing.T, main, users []byte) {
		dir := t.TempDir()
		mainPath, usersPath := filepath.Join(dir, "pgdog.toml"), filepath.Join(dir, "users.toml")
		if err := os.WriteFile(mainPath, main, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(usersPath, users, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(mainPath, usersPath)
		switch {
		case err == nil && c == nil:
			t.Fatal("Load returned neither a config nor an error")
		case err != nil && c != nil:
			t.Fatal("Load returned both a config and an error")
		case err != nil:
			if len(err.(*ProblemList).Problems) == 0 {
				t.Fatal("Load returned an empty problem list")
			}
		default:
			_ = c.Redacted()
			_ = Diff(c, c)
			// The line scanner agrees with the parser: every entry was found.
			for _, d := range c.Databases {
				if _, ok := c.PoolSettings("fuzz", d.Name); !ok {
					t.Fatalf("PoolSettings(%q) not found", d.Name)
				}
				if d.Line < 1 {
					t.Fatalf("database %q has no line", d.Name)
				}
			}
			for _, u := range c.Users {
				if u.Line < 1 {
					t.Fatalf("user %q has no line", u.Name)
				}
			}
		}
	})
}

// FuzzLocateKeys runs the line scanner on arbitrary text, valid TOML or
// not: it must neither panic nor loop.
func FuzzLocateKeys(f *testing.F) {
	for _, s := range []string{minimalMain, "a = \"\"\"\n", "[[", "'''", "x = [\n# ]\n", "\"\\", "[a.'b'.\"c\"]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		for path, line := range locateKeys(src) {
			if line < 1 {
				t.Fatalf("%q at line %d", path, line)
			}
		}
	})
}
