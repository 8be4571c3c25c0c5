package config

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// notInEffectRejected gives, for every notInEffect key, values that must be
// reported as not supported yet. A key added to the table without values
// here fails TestNotInEffect; a key removed from it (its feature built)
// must be removed here too.
var notInEffectRejected = map[string][]string{}

// notInEffectDefaults is every notInEffect key written at its default, as
// lines of a [general] section.
func notInEffectDefaults() string {
	var b strings.Builder
	for _, k := range notInEffect {
		b.WriteString(strings.TrimPrefix(k.Key, "general.") + " = " + k.Default + "\n")
	}
	return b.String()
}

// TestNotInEffect checks every key pgtender reads but does not act on yet:
// its default is accepted, and each value not in effect is one problem at
// the key's line.
func TestNotInEffect(t *testing.T) {
	const db = "[[databases]]\nname = \"app\"\n"
	defaults := reflect.ValueOf(Defaults().General)
	fields := tagIndex(defaults.Type())
	seen := map[string]bool{}
	for _, k := range notInEffect {
		name, ok := strings.CutPrefix(k.Key, "general.")
		f := fields[name]
		if !ok || f == nil {
			t.Errorf("notInEffect: %s is no [general] key", k.Key)
			continue
		}
		if seen[k.Key] {
			t.Errorf("notInEffect lists %s twice", k.Key)
		}
		seen[k.Key] = true
		if got := formatValue(defaults.FieldByIndex(f.index), false); got != k.Default {
			t.Errorf("notInEffect: %s default is %s, Defaults() has %s", k.Key, k.Default, got)
		}
		if _, listed := k.NotYet[k.Default]; listed {
			t.Errorf("notInEffect: %s lists its default as not in effect", k.Key)
		}
		if k.Why == "" {
			t.Errorf("notInEffect: %s has no reason", k.Key)
		}
		for v, instead := range k.NotYet {
			if instead == "" {
				t.Errorf("notInEffect: %s = %s says nothing to use instead", k.Key, v)
			}
		}

		// The default, written out, is accepted.
		mustLoad(t, "[general]\n"+name+" = "+k.Default+"\n"+db, nil)

		values := notInEffectRejected[k.Key]
		if len(values) == 0 {
			t.Errorf("notInEffectRejected has no values for %s", k.Key)
		}
		for v := range k.NotYet {
			if !slices.Contains(values, v) {
				t.Errorf("notInEffectRejected lacks %s = %s", k.Key, v)
			}
		}
		for _, v := range values {
			t.Run(name+"="+v, func(t *testing.T) {
				main := "\n[general]\nlog_level = \"warn\"\n" + name + " = " + v + "\n" + db
				checkProblems(t, loadProblems(t, main, nil), []want{
					{"pgdog.toml", 4, k.Key, "not supported by pgtender yet (planned: " + k.Why + ")"},
				})
			})
		}
	}
	for key := range notInEffectRejected {
		if !seen[key] {
			t.Errorf("notInEffectRejected has %s, which notInEffect does not list", key)
		}
	}

	// The values in effect of a key with listed values are accepted.
	for _, mode := range []string{"disabled", "enabled_plain", "enabled_plain_allow_change"} {
		mustLoad(t, "[general]\npassthrough_auth = \""+mode+"\"\n"+db, nil)
	}
	mustLoad(t, "[general]\nprepared_statements = \"disabled\"\n"+db, nil)
	mustLoad(t, "[general]\nprepared_statements = \"extended\"\n"+db, nil)

	// The keys whose features were built are accepted at any valid value.
	mustLoad(t, "[general]\nquery_timeout = 5\nclient_idle_in_transaction_timeout = 5\n"+db, nil)

	// A value that is wrong in itself is reported as such, not as planned.
	checkProblems(t, loadProblems(t, "[general]\nquery_timeout = -1\nhealthcheck_port = \"8080\"\n"+db, nil), []want{
		{"pgdog.toml", 2, "general.query_timeout", "must not be negative"},
		{"pgdog.toml", 3, "general.healthcheck_port", "must be an integer"},
	})
}

// TestNotInEffectKeys checks that the exported list is a sorted copy.
func TestNotInEffectKeys(t *testing.T) {
	got := NotInEffectKeys()
	if len(got) != len(notInEffect) {
		t.Fatalf("NotInEffectKeys() has %d keys, want %d", len(got), len(notInEffect))
	}
	if !slices.IsSortedFunc(got, func(a, b PlannedKey) int { return strings.Compare(a.Key, b.Key) }) {
		t.Errorf("NotInEffectKeys() is not sorted")
	}
	for _, k := range got {
		for v := range k.NotYet {
			k.NotYet[v] = "changed"
		}
	}
	for _, k := range notInEffect {
		for _, instead := range k.NotYet {
			if instead == "changed" {
				t.Errorf("NotInEffectKeys() shares %s's NotYet map", k.Key)
			}
		}
	}
}
