package config

import (
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
)

// PasswordKind is what a password string in users.toml or [admin] holds.
type PasswordKind int

const (
	// PasswordNone is an empty password.
	PasswordNone PasswordKind = iota
	// PasswordPlain is a cleartext password.
	PasswordPlain
	// PasswordMD5 is Postgres's "md5" + hex(md5(password + user)).
	PasswordMD5
	// PasswordSCRAM is Postgres's "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>".
	PasswordSCRAM
)

// String names the kind for messages.
func (k PasswordKind) String() string {
	switch k {
	case PasswordNone:
		return "none"
	case PasswordPlain:
		return "plaintext"
	case PasswordMD5:
		return "md5 secret"
	case PasswordSCRAM:
		return "SCRAM secret"
	}
	return "PasswordKind(" + strconv.Itoa(int(k)) + ")"
}

const scramPrefix = "SCRAM-SHA-256$"

// PasswordKindOf classifies a configured password the way Postgres
// classifies pg_authid.rolpassword: "md5" followed by 32 hex digits is an
// md5 secret (upper-case hex accepted, as package auth accepts it), anything
// starting with "SCRAM-SHA-256$" is a SCRAM secret (ParseSCRAMSecret says
// whether it is well formed), anything else is plaintext.
func PasswordKindOf(password string) PasswordKind {
	switch {
	case password == "":
		return PasswordNone
	case strings.HasPrefix(password, scramPrefix):
		return PasswordSCRAM
	case len(password) == 35 && strings.HasPrefix(password, "md5") && isHex(password[3:]):
		return PasswordMD5
	}
	return PasswordPlain
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// SCRAMSecret is a parsed SCRAM-SHA-256 secret as Postgres stores it.
type SCRAMSecret struct {
	Iterations int
	Salt       []byte
	StoredKey  []byte // 32 bytes
	ServerKey  []byte // 32 bytes
}

// ParseSCRAMSecret parses "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>"
// with base64 salt and keys, the format of pg_authid.rolpassword.
func ParseSCRAMSecret(secret string) (SCRAMSecret, error) {
	rest, ok := strings.CutPrefix(secret, scramPrefix)
	if !ok {
		return SCRAMSecret{}, errors.New(`a SCRAM secret starts with "SCRAM-SHA-256$"`)
	}
	params, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return SCRAMSecret{}, errors.New(`malformed SCRAM secret: want SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`)
	}
	iter, salt64, ok1 := strings.Cut(params, ":")
	stored64, server64, ok2 := strings.Cut(keys, ":")
	if !ok1 || !ok2 {
		return SCRAMSecret{}, errors.New(`malformed SCRAM secret: want SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`)
	}
	var s SCRAMSecret
	var err error
	if s.Iterations, err = strconv.Atoi(iter); err != nil || s.Iterations < 1 {
		return SCRAMSecret{}, errors.New("malformed SCRAM secret: iteration count is not a positive integer")
	}
	if s.Salt, err = base64.StdEncoding.DecodeString(salt64); err != nil || len(s.Salt) == 0 {
		return SCRAMSecret{}, errors.New("malformed SCRAM secret: salt is not base64")
	}
	if s.StoredKey, err = base64.StdEncoding.DecodeString(stored64); err != nil || len(s.StoredKey) != 32 {
		return SCRAMSecret{}, errors.New("malformed SCRAM secret: StoredKey is not 32 bytes of base64")
	}
	if s.ServerKey, err = base64.StdEncoding.DecodeString(server64); err != nil || len(s.ServerKey) != 32 {
		return SCRAMSecret{}, errors.New("malformed SCRAM secret: ServerKey is not 32 bytes of base64")
	}
	return s, nil
}
