package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Load reads pgdog.toml and users.toml (usersPath may be "": no users),
// applies defaults, decodes strictly, validates everything and returns a
// frozen *Config. On any problem it returns (nil, err) where err is a
// *ProblemList listing all problems at once, each with its file, line and
// key path.
//
// Decoding goes through map[string]any rather than straight into the
// structs so that a wrong type on one key is one problem among others, not
// the end of decoding.
func Load(configPath, usersPath string) (*Config, error) {
	l := &loader{
		ps:              problems{order: map[string]int{configPath: 0}},
		defaultPoolPath: "general.default_pool_size",
	}
	cfg := Defaults()
	cfg.ConfigPath, cfg.UsersPath = configPath, usersPath

	l.main = l.read(configPath)
	if l.main.parsed {
		l.decodeMain(&cfg)
	}
	if usersPath != "" {
		if _, ok := l.ps.order[usersPath]; !ok {
			l.ps.order[usersPath] = 1
		}
		l.users = l.read(usersPath)
		if l.users.parsed {
			l.decodeUsers(&cfg)
		}
	}
	l.validate(&cfg)
	if len(l.ps.list) > 0 {
		return nil, &ProblemList{Problems: l.ps.sorted()}
	}

	cfg.databaseIndex = make(map[string]int, len(cfg.Databases))
	for i, d := range cfg.Databases {
		cfg.databaseIndex[d.Name] = i
	}
	cfg.userIndex = make(map[userKey]int, len(cfg.Users))
	for i, u := range cfg.Users {
		cfg.userIndex[userKey{u.Name, u.Database}] = i
	}
	return &cfg, nil
}

// source is one file being loaded.
type source struct {
	path    string
	parsed  bool           // read and valid TOML
	data    map[string]any // the decoded document
	lines   keyLines
	present map[string]bool // key paths written in the file
}

func (s *source) line(path string) int {
	if s == nil {
		return 0
	}
	return s.lines.line(path)
}

type loader struct {
	ps    problems
	main  *source // pgdog.toml
	users *source // users.toml; nil when usersPath is ""

	adminSource     *source // the file [admin] came from (users.toml may override, as in PgDog)
	defaultPoolPath string  // "general.default_pool_size" or "general.max_pool_size", as written
}

func (l *loader) problem(src *source, key, format string, args ...any) {
	l.ps.add(src.path, src.line(key), key, format, args...)
}

// read loads and parses one file. A file that cannot be read or parsed is
// one problem; the other file is still checked.
func (l *loader) read(path string) *source {
	src := &source{path: path, lines: keyLines{}, present: map[string]bool{}}
	data, err := os.ReadFile(path)
	if err != nil {
		reason := err
		if pe, ok := errors.AsType[*fs.PathError](err); ok {
			reason = pe.Err
		}
		if errors.Is(err, fs.ErrNotExist) {
			l.ps.add(path, 0, "", "cannot read file: it does not exist")
		} else {
			l.ps.add(path, 0, "", "cannot read file: %v", reason)
		}
		return src
	}
	doc, err := parseTOML(string(data))
	if err != nil {
		if pe, ok := errors.AsType[toml.ParseError](err); ok {
			l.ps.add(path, pe.Position.Line, "", "invalid TOML: %s", pe.Message)
		} else {
			l.ps.add(path, 0, "", "invalid TOML: %v", err)
		}
		return src
	}
	src.parsed, src.data, src.lines = true, doc, locateKeys(string(data))
	return src
}

// parseTOML decodes a document into maps. The TOML library turns its own
// syntax errors into a ParseError; any other panic it raises on hostile
// input becomes an error here rather than taking the process down.
func parseTOML(data string) (doc map[string]any, err error) {
	defer func() {
		if r := recover(); r != nil {
			doc, err = nil, fmt.Errorf("parser failed: %v", r)
		}
	}()
	doc = map[string]any{}
	if _, err := toml.Decode(data, &doc); err != nil {
		return nil, err
	}
	return doc, nil
}

func (l *loader) decodeMain(cfg *Config) {
	src := l.main
	generalKeys := tagIndex(reflect.TypeFor[General]())
	for _, key := range sortedKeys(src.data) {
		v := src.data[key]
		switch {
		case key == "general":
			if tbl, ok := l.table(src, key, v); ok {
				l.decodeGeneral(src, tbl, &cfg.General)
			}
		case key == "admin":
			if tbl, ok := l.table(src, key, v); ok {
				l.decodeTable(src, key, tbl, &cfg.Admin, nil, nil)
				l.adminSource = src
			}
		case key == "databases":
			for i, tbl := range l.tables(src, key, v) {
				path := fmt.Sprintf("databases[%d]", i)
				d := DefaultDatabase()
				l.decodeTable(src, path, tbl, &d, l.databaseKey, unsupportedDatabase)
				if !src.present[path+".database_name"] {
					d.DatabaseName = d.Name
				}
				d.Line = src.line(path)
				cfg.Databases = append(cfg.Databases, d)
			}
		case unsupportedSections[key]:
			l.problem(src, key, "not supported by pgtender yet")
		case key == "users":
			l.problem(src, key, "unknown key: [[users]] belong in users.toml")
		case generalKeys[key] != nil || unsupportedGeneral[key]:
			l.problem(src, key, "unknown key: %s is a [general] key; write it below the [general] header", key)
		default:
			l.problem(src, key, "unknown key")
		}
	}
}

func (l *loader) decodeUsers(cfg *Config) {
	src := l.users
	for _, key := range sortedKeys(src.data) {
		v := src.data[key]
		switch key {
		case "users":
			for i, tbl := range l.tables(src, key, v) {
				path := fmt.Sprintf("users[%d]", i)
				u := DefaultUser()
				l.decodeTable(src, path, tbl, &u, nil, unsupportedUser)
				u.Line = src.line(path)
				cfg.Users = append(cfg.Users, u)
			}
		case "admin":
			// PgDog lets users.toml carry [admin], replacing pgdog.toml's whole section.
			if tbl, ok := l.table(src, key, v); ok {
				cfg.Admin = Defaults().Admin
				l.decodeTable(src, key, tbl, &cfg.Admin, nil, nil)
				l.adminSource = src
			}
		case "general", "databases":
			l.problem(src, key, "unknown key: [%s] belongs in pgdog.toml", key)
		default:
			l.problem(src, key, "unknown key")
		}
	}
}

func (l *loader) decodeGeneral(src *source, tbl map[string]any, g *General) {
	if _, ok := tbl["max_pool_size"]; ok {
		if _, both := tbl["default_pool_size"]; both {
			l.problem(src, "general.max_pool_size", "max_pool_size is PgDog's alias of default_pool_size; set only one of them")
		} else {
			l.defaultPoolPath = "general.max_pool_size"
		}
	}
	alias := func(key, path string, v any) bool {
		if key != "max_pool_size" {
			return false
		}
		if l.defaultPoolPath == path {
			src.present[path] = true
			l.setField(src, path, reflect.ValueOf(g).Elem().FieldByName("DefaultPoolSize"), v)
		}
		return true
	}
	l.decodeTable(src, "general", tbl, g, alias, unsupportedGeneral)
}

// databaseKey accepts PgDog's role = "primary" and shard = 0: a single
// primary on shard 0 is exactly what a pgtender database is.
func (l *loader) databaseKey(key, path string, v any) bool {
	switch key {
	case "role":
		if v != "primary" {
			l.problem(l.main, path, `not supported by pgtender yet (only role = "primary", the default, is accepted)`)
		}
		return true
	case "shard":
		if v != int64(0) {
			l.problem(l.main, path, "not supported by pgtender yet (only shard = 0, the default, is accepted)")
		}
		return true
	}
	return false
}

// table checks that v is a TOML table.
func (l *loader) table(src *source, path string, v any) (map[string]any, bool) {
	tbl, ok := v.(map[string]any)
	if !ok {
		l.problem(src, path, "must be a table ([%s]), found %s", path, tomlType(v))
	}
	return tbl, ok
}

// tables checks that v is an array of tables ([[path]] entries, or an
// inline array of inline tables).
func (l *loader) tables(src *source, path string, v any) []map[string]any {
	switch t := v.(type) {
	case []map[string]any:
		return t
	case []any:
		out := make([]map[string]any, 0, len(t))
		for i, e := range t {
			tbl, ok := e.(map[string]any)
			if !ok {
				l.problem(src, fmt.Sprintf("%s[%d]", path, i), "must be a table, found %s", tomlType(e))
				continue
			}
			out = append(out, tbl)
		}
		return out
	}
	l.problem(src, path, "must be an array of tables ([[%s]]), found %s", path, tomlType(v))
	return nil
}

// decodeTable sets the fields of *dst (a struct with toml tags) from tbl.
// special, when not nil, handles keys first and reports whether it did.
// Keys that match no field are reported as not supported (when in
// unsupported) or unknown.
func (l *loader) decodeTable(src *source, prefix string, tbl map[string]any, dst any,
	special func(key, path string, v any) bool, unsupported map[string]bool) {
	rv := reflect.ValueOf(dst).Elem()
	fields := tagIndex(rv.Type())
	for _, key := range sortedKeys(tbl) {
		v, path := tbl[key], prefix+"."+key
		if special != nil && special(key, path, v) {
			continue
		}
		f := fields[key]
		switch {
		case f != nil:
			src.present[path] = true
			l.setField(src, path, rv.FieldByIndex(f.index), v)
		case unsupported[key]:
			l.problem(src, path, "not supported by pgtender yet")
		default:
			l.problem(src, path, "unknown key")
		}
	}
}

// setField converts one TOML value to the field's type. The value itself is
// never echoed: the field may hold a password.
func (l *loader) setField(src *source, path string, f reflect.Value, v any) {
	switch f.Kind() {
	case reflect.String:
		s, ok := v.(string)
		if !ok {
			l.problem(src, path, "must be a string, found %s", tomlType(v))
			return
		}
		f.SetString(s)
	case reflect.Bool:
		b, ok := v.(bool)
		if !ok {
			l.problem(src, path, "must be true or false, found %s", tomlType(v))
			return
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, ok := v.(int64)
		if !ok {
			l.problem(src, path, "must be an integer, found %s", tomlType(v))
			return
		}
		if f.OverflowInt(n) {
			l.problem(src, path, "%d is out of range", n)
			return
		}
		f.SetInt(n)
	default:
		panic("config: no decoder for field kind " + f.Kind().String())
	}
}

// tomlType names the TOML type of a decoded value, for messages.
func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case time.Time:
		return "a date-time"
	case []map[string]any:
		return "an array of tables"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return fmt.Sprintf("a %T", v)
}

// fieldInfo describes one tagged struct field.
type fieldInfo struct {
	key     string
	index   []int
	secret  bool
	restart bool
}

// tagFields lists the fields of a struct that carry a toml tag, in order.
func tagFields(t reflect.Type) []*fieldInfo {
	var out []*fieldInfo
	for i := range t.NumField() {
		sf := t.Field(i)
		key := sf.Tag.Get("toml")
		if key == "" || key == "-" || !sf.IsExported() {
			continue
		}
		out = append(out, &fieldInfo{
			key:     key,
			index:   sf.Index,
			secret:  sf.Tag.Get("secret") == "true",
			restart: sf.Tag.Get("restart") == "true",
		})
	}
	return out
}

func tagIndex(t reflect.Type) map[string]*fieldInfo {
	m := map[string]*fieldInfo{}
	for _, f := range tagFields(t) {
		m[f.key] = f
	}
	return m
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

func sortedSet(m map[string]bool) []string { return sortedKeys(m) }

// quoteList formats allowed values for messages: "a", "b" or "c".
func quoteList(values []string) string {
	q := make([]string, len(values))
	for i, v := range values {
		q[i] = fmt.Sprintf("%q", v)
	}
	if len(q) <= 1 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
