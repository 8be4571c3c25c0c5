package pooler

import (
	"testing"

	"github.com/pgtender/pgtender/pooler/wire"
)

func TestTrackedParameter(t *testing.T) {
	for name, want := range map[string]string{
		"TimeZone": "TimeZone", "timezone": "TimeZone", "APPLICATION_NAME": "application_name",
		"DateStyle": "DateStyle", "search_path": "", "user": "", "": "",
	} {
		if got := trackedParameter(name); got != want {
			t.Errorf("trackedParameter(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestSetStatements(t *testing.T) {
	client := parameterValues{"TimeZone": "Asia/Kolkata", "application_name": "it's", "DateStyle": "ISO, MDY"}
	server := parameterValues{"TimeZone": "Etc/UTC", "application_name": "", "DateStyle": "ISO, MDY", "client_encoding": "UTF8"}
	want := "SET application_name = 'it''s';SET TimeZone = 'Asia/Kolkata';"
	if got := setStatements(client, server); got != want {
		t.Errorf("setStatements = %q, want %q", got, want)
	}
	if got := setStatements(client, client.clone()); got != "" {
		t.Errorf("setStatements of equal values = %q, want none", got)
	}
	server["TimeZone"] = unknownValue
	server["application_name"] = "it's"
	if got, want := setStatements(client, server), "SET TimeZone = 'Asia/Kolkata';"; got != want {
		t.Errorf("setStatements with an unknown server value = %q, want %q", got, want)
	}
}

func TestParseParameterStatus(t *testing.T) {
	msg := wire.AppendParameterStatus(nil, "TimeZone", "Europe/Paris")
	body := msg[wire.HeaderLen:]
	name, value, ok := parseParameterStatus(body, len(body))
	if !ok || name != "TimeZone" || value != "Europe/Paris" {
		t.Fatalf("parse = %q %q %v", name, value, ok)
	}
	if _, _, ok := parseParameterStatus(body[:4], len(body)); ok {
		t.Error("a body cut short by the inspection limit parsed")
	}
	if _, _, ok := parseParameterStatus([]byte("TimeZone"), 8); ok {
		t.Error("a body without terminators parsed")
	}
}
