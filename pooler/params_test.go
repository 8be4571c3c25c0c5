package pooler

import (
	"testing"

	"github.com/pgtender/pgtender/pooler/wire"
)

func TestReportedParameter(t *testing.T) {
	for name, want := range map[string]string{
		"TimeZone": "TimeZone", "timezone": "TimeZone", "APPLICATION_NAME": "application_name",
		"DateStyle": "DateStyle", "search_path": "", "user": "", "": "",
	} {
		if got := reportedParameter(name); got != want {
			t.Errorf("reportedParameter(%q) = %q, want %q", name, got, want)
		}
	}
}

func settingsOf(pairs ...string) sessionSettings {
	s := make(sessionSettings)
	for i := 0; i < len(pairs); i += 2 {
		s.set(pairs[i], pairs[i+1])
	}
	return s
}

func TestAlignStatements(t *testing.T) {
	tests := []struct {
		name       string
		want, have sessionSettings
		sql        string
	}{
		{"both empty", nil, nil, ""},
		{"equal", settingsOf("TimeZone", "Asia/Kolkata"), settingsOf("timezone", "Asia/Kolkata"), ""},
		{"set what differs, quoted",
			settingsOf("application_name", "it's", "search_path", `"$user", public`),
			settingsOf("application_name", "other"),
			`SELECT pg_catalog.set_config('application_name', 'it''s', false), pg_catalog.set_config('search_path', '"$user", public', false);`},
		{"reset what the client lacks",
			nil,
			settingsOf("statement_timeout", "1ms", "app.tenant", "7", "DateStyle", "SQL, DMY"),
			"RESET app.tenant;RESET datestyle;RESET statement_timeout;"},
		{"both",
			settingsOf("work_mem", "77MB"),
			settingsOf("role", "reader", "work_mem", "4MB"),
			"RESET role;SELECT pg_catalog.set_config('work_mem', '77MB', false);"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := alignStatements(tt.want, tt.have); got != tt.sql {
				t.Errorf("alignStatements = %q\nwant             %q", got, tt.sql)
			}
		})
	}
}

func TestQuoteParameterName(t *testing.T) {
	for name, want := range map[string]string{
		"statement_timeout": "statement_timeout",
		"app.tenant":        "app.tenant",
		"DateStyle":         `"DateStyle"`,
		`we"ird.x`:          `"we""ird"."x"`,
		"9lives":            `"9lives"`,
	} {
		if got := quoteParameterName(name); got != want {
			t.Errorf("quoteParameterName(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestSessionSettingsOverlaid(t *testing.T) {
	startup := settingsOf("application_name", "app", "TimeZone", "UTC")
	probed := settingsOf("timezone", "Asia/Kolkata", "search_path", "tenant_1")
	got := probed.overlaid(startup)
	want := settingsOf("application_name", "app", "TimeZone", "Asia/Kolkata", "search_path", "tenant_1")
	if !got.equal(want) {
		t.Errorf("overlaid = %v, want %v", got, want)
	}
	if len(startup) != 2 {
		t.Errorf("overlaid changed its base: %v", startup)
	}
}

func TestParameterStatusName(t *testing.T) {
	msg := wire.AppendParameterStatus(nil, "TimeZone", "Europe/Paris")
	if got := parameterStatusName(msg[wire.HeaderLen:]); got != "TimeZone" {
		t.Errorf("name = %q", got)
	}
	if got := parameterStatusName([]byte("TimeZo")); got != "" {
		t.Errorf("name of a cut body = %q, want none", got)
	}
}

func TestQuoteLiteral(t *testing.T) {
	for value, want := range map[string]string{
		"plain":   `'plain'`,
		"it's":    `'it''s'`,
		`a\b`:     `E'a\\b'`,
		`tail\`:   `E'tail\\'`,
		`x\'; --`: `E'x\\''; --'`,
		"":        `''`,
	} {
		if got := quoteLiteral(value); got != want {
			t.Errorf("quoteLiteral(%q) = %s, want %s", value, got, want)
		}
	}
}

func TestSettingKey(t *testing.T) {
	for name, want := range map[string]string{
		"search_path": "search_path", "TimeZone": "timezone", "App.Tenant": "app.tenant",
		"Été.X": "Été.x", // only ASCII letters fold, as in Postgres
	} {
		if got := settingKey(name); got != want {
			t.Errorf("settingKey(%q) = %q, want %q", name, got, want)
		}
	}
}
