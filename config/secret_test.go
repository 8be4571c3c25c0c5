package config

import (
	"strings"
	"testing"
)

func TestPasswordKindOf(t *testing.T) {
	for _, tc := range []struct {
		password string
		want     PasswordKind
	}{
		{"", PasswordNone},
		{"hunter2", PasswordPlain},
		{md5Secret, PasswordMD5},
		{strings.ToUpper(md5Secret[3:]), PasswordPlain},
		{"md5" + strings.Repeat("A", 32), PasswordMD5}, // upper case accepted, as package auth does
		{"md5" + strings.Repeat("g", 32), PasswordPlain},
		{"md5" + strings.Repeat("a", 31), PasswordPlain},
		{scramSecret(), PasswordSCRAM},
		{"SCRAM-SHA-256$garbage", PasswordSCRAM},
	} {
		if got := PasswordKindOf(tc.password); got != tc.want {
			t.Errorf("PasswordKindOf(%q) = %v, want %v", tc.password, got, tc.want)
		}
	}
}

func TestParseSCRAMSecret(t *testing.T) {
	s, err := ParseSCRAMSecret(scramSecret())
	if err != nil {
		t.Fatal(err)
	}
	if s.Iterations != 4096 || string(s.Salt) != "0123456789abcdef" ||
		string(s.StoredKey) != strings.Repeat("k", 32) || string(s.ServerKey) != strings.Repeat("s", 32) {
		t.Errorf("ParseSCRAMSecret = %+v", s)
	}
	good := strings.SplitN(scramSecret(), "$", 3) // "SCRAM-SHA-256", "4096:salt", "stored:server"
	for _, bad := range []string{
		"plain",
		"SCRAM-SHA-256$",
		"SCRAM-SHA-256$4096:" + strings.Split(good[1], ":")[1],
		"SCRAM-SHA-256$0:" + strings.Split(good[1], ":")[1] + "$" + good[2],
		"SCRAM-SHA-256$x:" + strings.Split(good[1], ":")[1] + "$" + good[2],
		"SCRAM-SHA-256$4096:!!$" + good[2],
		"SCRAM-SHA-256$" + good[1] + "$c2hvcnQ=:" + strings.Split(good[2], ":")[1],
		"SCRAM-SHA-256$" + good[1] + "$" + strings.Split(good[2], ":")[0] + ":c2hvcnQ=",
		"SCRAM-SHA-256$" + good[1] + "$" + strings.Split(good[2], ":")[0],
	} {
		if _, err := ParseSCRAMSecret(bad); err == nil {
			t.Errorf("ParseSCRAMSecret(%q) succeeded", bad)
		}
	}
}
