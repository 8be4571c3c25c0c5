package config

import (
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsAndExamplesCoverEveryKey keeps docs/configuration.md and the
// example files true: every key pgtender reads is documented (with the
// right reload behaviour) and appears in an example, and the list of
// unsupported PgDog keys matches keys.go.
func TestDocsAndExamplesCoverEveryKey(t *testing.T) {
	doc := readFile(t, "../docs/configuration.md")
	mainExample := readFile(t, "../pgdog.toml.example")
	usersExample := readFile(t, "../users.toml.example")

	sections := []struct {
		name    string
		typ     reflect.Type
		example string
	}{
		{"[general]", reflect.TypeFor[General](), mainExample},
		{"[admin]", reflect.TypeFor[Admin](), mainExample},
		{"[[databases]]", reflect.TypeFor[Database](), mainExample},
		{"[[users]]", reflect.TypeFor[User](), usersExample},
	}
	for _, s := range sections {
		i := strings.Index(doc, "\n### "+s.name+"\n")
		if i < 0 {
			t.Errorf("docs/configuration.md has no ### %s section", s.name)
			continue
		}
		table := doc[i+1:]
		if end := strings.Index(table[1:], "\n#"); end >= 0 {
			table = table[:end+1]
		}
		for _, f := range tagFields(s.typ) {
			row := regexp.MustCompile("(?m)^\\| `" + f.key + "` \\|[^|]*\\| (reload|restart) \\|")
			m := row.FindStringSubmatch(table)
			if m == nil {
				t.Errorf("docs/configuration.md has no %s row for %s", s.name, f.key)
			} else if (m[1] == "restart") != f.restart {
				t.Errorf("docs/configuration.md says %s %s is %q; config.Diff disagrees", s.name, f.key, m[1])
			}
			if !regexp.MustCompile(`(?m)^(# )?` + f.key + ` = `).MatchString(s.example) {
				t.Errorf("the example for %s lacks %s", s.name, f.key)
			}
		}
	}

	start := strings.Index(doc, "## PgDog keys not supported yet")
	if start < 0 {
		t.Fatal("docs/configuration.md lacks the unsupported keys section")
	}
	section := doc[start:]
	for _, list := range []struct{ heading, group string }{
		{"Sections of `pgdog.toml`:", "sections"},
		{"`[general]`:", "general"},
		{"`[[databases]]`:", "databases"},
		{"`[[users]]`:", "users"},
	} {
		i := strings.Index(section, "\n"+list.heading)
		if i < 0 {
			t.Errorf("docs: no %s list", list.heading)
			continue
		}
		para := section[i+1:]
		para = para[:strings.Index(para, "\n\n")]
		var got []string
		for _, m := range regexp.MustCompile("`\\[*([a-z_]+)\\]*`").FindAllStringSubmatch(para[len(list.heading):], -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if want := UnsupportedKeys()[list.group]; !slices.Equal(got, want) {
			t.Errorf("docs list %s =\n%q\nkeys.go =\n%q", list.heading, got, want)
		}
	}
}

// TestDocsListKeysNotInEffect keeps the "Read but not in effect yet"
// section of docs/configuration.md equal to notInEffect: one row per key,
// naming its default (or each value not in effect yet), and the examples
// mark every such key as planned.
func TestDocsListKeysNotInEffect(t *testing.T) {
	doc := readFile(t, "../docs/configuration.md")
	start := strings.Index(doc, "\n## Read but not in effect yet\n")
	if start < 0 {
		t.Fatal("docs/configuration.md lacks the section ## Read but not in effect yet")
	}
	section := doc[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_.]+)` \\|(.*)$").FindAllStringSubmatch(section, -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("docs: %s is listed twice as not in effect", m[1])
		}
		rows[m[1]] = m[2]
	}
	var want []string
	for _, k := range NotInEffectKeys() {
		want = append(want, k.Key)
		row, ok := rows[k.Key]
		if !ok {
			continue
		}
		if len(k.NotYet) == 0 && !strings.Contains(row, "`"+k.Default+"`") {
			t.Errorf("docs: the row of %s does not name its default `%s`", k.Key, k.Default)
		}
		for v := range k.NotYet {
			if !strings.Contains(row, "`"+v+"`") {
				t.Errorf("docs: the row of %s does not name `%s`", k.Key, v)
			}
		}
	}
	got := slices.Sorted(maps.Keys(rows))
	if !slices.Equal(got, want) {
		t.Errorf("docs list not in effect =\n%q\nkeys.go =\n%q", got, want)
	}

	// The example marks each of them as planned, in the paragraph that
	// writes the key: commented out when every value but the default is
	// planned, else naming the values that are.
	example := readFile(t, "../pgdog.toml.example")
	for _, k := range notInEffect {
		key := strings.TrimPrefix(k.Key, "general.")
		pattern := `(?m)^# ` + key + ` = `
		if len(k.NotYet) > 0 {
			pattern = `(?m)^(# )?` + key + ` = `
		}
		i := regexp.MustCompile(pattern).FindStringIndex(example)
		if i == nil {
			t.Errorf("pgdog.toml.example does not write %s (commented out unless it has values in effect)", key)
			continue
		}
		para := example[strings.LastIndex(example[:i[0]], "\n\n")+1:]
		if j := strings.Index(para, "\n\n"); j >= 0 {
			para = para[:j]
		}
		if !strings.Contains(strings.ToLower(para), "planned") {
			t.Errorf("pgdog.toml.example: the paragraph of %s does not say it is planned:\n%s", key, para)
		}
		for v := range k.NotYet {
			if !strings.Contains(para, v) {
				t.Errorf("pgdog.toml.example: the paragraph of %s does not name %s", key, v)
			}
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
