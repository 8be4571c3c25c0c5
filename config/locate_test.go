package config

import (
	"maps"
	"testing"
)

func TestLocateKeys(t *testing.T) {
	src := `# comment with a fake = key
[general]   # trailing comment
port = 6432
"quoted key" = 1
dotted.key = 2
'literal' = 3
text = """
not_a_key = 1
[not_a_table]
"""
raw = '''
[[not_an_array]]
'''
list = [
  "a = b", # not_a_key = 2
  [1, 2],
  { x = 1 },
]
escaped = "quote \" inside = no"
inline = { a = 1,
  b = 2 }

[[databases]]
name = "a"

[[ databases ]]
name = "b"
host = "h"

[admin]
password = "x"
`
	want := keyLines{
		"general":            2,
		"general.port":       3,
		"general.quoted key": 4,
		"general.dotted.key": 5,
		"general.literal":    6,
		"general.text":       7,
		"general.raw":        11,
		"general.list":       14,
		"general.escaped":    19,
		"general.inline":     20,
		"databases":          23,
		"databases[0]":       23,
		"databases[0].name":  24,
		"databases[1]":       26,
		"databases[1].name":  27,
		"databases[1].host":  28,
		"admin":              30,
		"admin.password":     31,
	}
	got := locateKeys(src)
	if !maps.Equal(got, want) {
		t.Errorf("locateKeys =\n%v\nwant\n%v", got, want)
	}
	// Every recorded key is also a key the TOML parser sees.
	if _, err := parseTOML(src); err != nil {
		t.Fatalf("the test document is not valid TOML: %v", err)
	}

	for path, line := range map[string]int{
		"databases[1].pool_size": 26, // missing key: the entry's header
		"databases[7].name":      23, // no such entry: the array's first header
		"general.inline.a":       20, // inside an inline table: the key holding it
		"nothing.at.all":         0,
		"":                       0,
	} {
		if got := want.line(path); got != line {
			t.Errorf("line(%q) = %d, want %d", path, got, line)
		}
	}
}
