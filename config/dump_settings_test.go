package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestSettingsForShowConfig checks what SHOW CONFIG lists: every [general]
// and [admin] key once, running values beside defaults, secrets masked,
// restart-only keys not changeable.
func TestSettingsForShowConfig(t *testing.T) {
	c := Defaults()
	c.General.DefaultPoolSize = 33
	c.General.OpenMetricsNamespace = "pgdog_"
	c.Admin.Password = "hunter2-console"
	settings := c.Settings()
	byKey := make(map[string]Setting, len(settings))
	for _, s := range settings {
		if _, dup := byKey[s.Key]; dup {
			t.Errorf("key %s listed twice", s.Key)
		}
		byKey[s.Key] = s
		if strings.Contains(s.Value, "hunter2") || strings.Contains(s.Default, "hunter2") {
			t.Errorf("%s shows the password: %+v", s.Key, s)
		}
	}
	if n := len(tagFields(reflect.TypeOf(c.General))) + len(tagFields(reflect.TypeOf(c.Admin))); len(settings) != n {
		t.Errorf("%d settings, want %d", len(settings), n)
	}
	for key, want := range map[string]Setting{
		"default_pool_size":     {Key: "default_pool_size", Value: "33", Default: "10", Changeable: true},
		"openmetrics_namespace": {Key: "openmetrics_namespace", Value: "pgdog_", Default: "", Changeable: false},
		"port":                  {Key: "port", Value: "6432", Default: "6432", Changeable: false},
		"admin.password":        {Key: "admin.password", Value: "***", Default: "", Changeable: true},
		"admin.name":            {Key: "admin.name", Value: "admin", Default: "admin", Changeable: true},
	} {
		if got := byKey[key]; got != want {
			t.Errorf("%s = %+v, want %+v", key, got, want)
		}
	}
}
