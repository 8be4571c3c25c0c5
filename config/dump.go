package config

import (
	"cmp"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// redactedPassword replaces every non-empty password in Redacted.
const redactedPassword = "***"

// Redacted returns the effective configuration as TOML text, every password
// replaced by "***". Pool settings an entry inherits are shown with the
// inherited value and an "# inherited" comment. It is what SHOW CONFIG and
// --check-config print; it never contains a password.
func (c *Config) Redacted() string {
	var b strings.Builder
	b.WriteString("# pgtender effective configuration; passwords are shown as \"***\"\n")
	fmt.Fprintf(&b, "# config: %s\n", c.ConfigPath)
	if c.UsersPath != "" {
		fmt.Fprintf(&b, "# users: %s\n", c.UsersPath)
	}

	b.WriteString("\n[general]\n")
	writeFields(&b, reflect.ValueOf(c.General), nil)
	b.WriteString("\n[admin]\n")
	writeFields(&b, reflect.ValueOf(c.Admin), nil)

	for _, d := range c.Databases {
		b.WriteString("\n[[databases]]\n")
		writeFields(&b, reflect.ValueOf(d), func(key string) (string, bool) {
			switch key {
			case "pool_size":
				return inherited(d.PoolSize > 0, c.General.DefaultPoolSize)
			case "min_pool_size":
				return inherited(d.MinPoolSize >= 0, c.General.MinPoolSize)
			case "pooler_mode":
				return inherited(d.PoolerMode != "", c.General.PoolerMode)
			}
			return "", false
		})
	}
	for _, u := range c.Users {
		b.WriteString("\n[[users]]\n")
		// The user's effective pool settings, as PoolSettings resolves them.
		s, dbExists := c.PoolSettings(u.Name, u.Database)
		writeFields(&b, reflect.ValueOf(u), func(key string) (string, bool) {
			if !dbExists {
				return "", false
			}
			switch key {
			case "pool_size":
				return inherited(u.PoolSize > 0, s.PoolSize)
			case "min_pool_size":
				return inherited(u.MinPoolSize >= 0, s.MinPoolSize)
			case "pooler_mode":
				return inherited(u.PoolerMode != "", s.PoolerMode)
			}
			return "", false
		})
	}
	return b.String()
}

// inherited formats an inherited value when the entry does not set its own.
func inherited(set bool, value any) (string, bool) {
	if set {
		return "", false
	}
	return formatValue(reflect.ValueOf(value), false) + "  # inherited", true
}

// writeFields writes "key = value" for every tagged field of v. override,
// when not nil, may supply the text of a value.
func writeFields(b *strings.Builder, v reflect.Value, override func(key string) (string, bool)) {
	for _, f := range tagFields(v.Type()) {
		text, ok := "", false
		if override != nil {
			text, ok = override(f.key)
		}
		if !ok {
			text = formatValue(v.FieldByIndex(f.index), f.secret)
		}
		fmt.Fprintf(b, "%s = %s\n", f.key, text)
	}
}

func formatValue(v reflect.Value, secret bool) string {
	switch v.Kind() {
	case reflect.String:
		if secret && v.String() != "" {
			return strconv.Quote(redactedPassword)
		}
		return strconv.Quote(v.String())
	case reflect.Bool:
		return strconv.FormatBool(v.Bool())
	case reflect.Int, reflect.Int64:
		return strconv.FormatInt(v.Int(), 10)
	}
	if secret {
		return strconv.Quote(redactedPassword)
	}
	return fmt.Sprint(v.Interface())
}

// ConfigDiff says what a reload from one config to another changes.
type ConfigDiff struct {
	// RestartRequired lists the changed keys a reload cannot apply: host,
	// port, workers, listen_backlog, passthrough_auth, openmetrics_*,
	// healthcheck_port, log_level and log_format (the keys tagged
	// restart:"true"). The running process keeps the old values until it
	// is restarted.
	RestartRequired []string
	// Changed lists every changed key path, RestartRequired ones included.
	// Entries are named by name, not index, since a reload may reorder them:
	// `databases["app"].pool_size`, `users["alice","app"].password`. An
	// added or removed entry appears as its path alone (`databases["app"]`).
	// Values are never included, so passwords do not leak into logs.
	Changed []string
}

// Empty reports whether nothing changed.
func (d ConfigDiff) Empty() bool { return len(d.Changed) == 0 }

// Diff says what a reload from old to new changes. To decide whether a
// running pool can be kept, compare old.PoolSettings(u, d) with
// new.PoolSettings(u, d): that covers inheritance and passthrough users,
// which no key path does.
func Diff(old, new *Config) ConfigDiff {
	if old == nil {
		old = &Config{}
	}
	if new == nil {
		new = &Config{}
	}
	var d ConfigDiff
	diffFields(&d, "general", reflect.ValueOf(old.General), reflect.ValueOf(new.General))
	diffFields(&d, "admin", reflect.ValueOf(old.Admin), reflect.ValueOf(new.Admin))

	diffEntries(&d, old.Databases, new.Databases,
		func(x Database) string { return strconv.Quote(x.Name) },
		func(x Database) string { return "databases[" + strconv.Quote(x.Name) + "]" })
	diffEntries(&d, old.Users, new.Users,
		func(x User) string { return strconv.Quote(x.Name) + "," + strconv.Quote(x.Database) },
		func(x User) string { return "users[" + strconv.Quote(x.Name) + "," + strconv.Quote(x.Database) + "]" })
	return d
}

func diffFields(d *ConfigDiff, prefix string, old, new reflect.Value) {
	for _, f := range tagFields(old.Type()) {
		if old.FieldByIndex(f.index).Equal(new.FieldByIndex(f.index)) {
			continue
		}
		path := prefix + "." + f.key
		d.Changed = append(d.Changed, path)
		if f.restart {
			d.RestartRequired = append(d.RestartRequired, path)
		}
	}
}

// diffEntries compares two lists of entries matched by key. Entries appear
// in key order; an entry listed twice (which Load rejects) is compared by
// its first occurrence.
func diffEntries[T any](d *ConfigDiff, old, new []T, key, path func(T) string) {
	index := func(list []T) map[string]T {
		m := make(map[string]T, len(list))
		for _, e := range list {
			if _, dup := m[key(e)]; !dup {
				m[key(e)] = e
			}
		}
		return m
	}
	oldByKey, newByKey := index(old), index(new)
	keys := make([]string, 0, len(oldByKey)+len(newByKey))
	for k := range oldByKey {
		keys = append(keys, k)
	}
	for k := range newByKey {
		if _, ok := oldByKey[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, cmp.Compare)
	for _, k := range keys {
		o, inOld := oldByKey[k]
		n, inNew := newByKey[k]
		switch {
		case !inOld:
			d.Changed = append(d.Changed, path(n))
		case !inNew:
			d.Changed = append(d.Changed, path(o))
		default:
			diffFields(d, path(n), reflect.ValueOf(o), reflect.ValueOf(n))
		}
	}
}

// Setting is one key of [general] or [admin] as SHOW CONFIG lists it.
type Setting struct {
	Key     string // "listen_backlog"; [admin]'s keys as "admin.name"
	Value   string // the running value, unquoted; a secret as "***"
	Default string // the value Defaults gives
	// Changeable: a reload applies a change to it; false for the keys
	// tagged restart:"true".
	Changeable bool
}

// Settings lists the [general] and [admin] keys with their values, in the
// order Redacted writes them. No password appears in it.
func (c *Config) Settings() []Setting {
	defaults := Defaults()
	var out []Setting
	add := func(prefix string, v, d reflect.Value) {
		for _, f := range tagFields(v.Type()) {
			out = append(out, Setting{
				Key:        prefix + f.key,
				Value:      settingText(v.FieldByIndex(f.index), f.secret),
				Default:    settingText(d.FieldByIndex(f.index), f.secret),
				Changeable: !f.restart,
			})
		}
	}
	add("", reflect.ValueOf(c.General), reflect.ValueOf(defaults.General))
	add("admin.", reflect.ValueOf(c.Admin), reflect.ValueOf(defaults.Admin))
	return out
}

// settingText is formatValue without TOML's quotes.
func settingText(v reflect.Value, secret bool) string {
	text := formatValue(v, secret)
	if unquoted, err := strconv.Unquote(text); err == nil && v.Kind() == reflect.String {
		return unquoted
	}
	return text
}
