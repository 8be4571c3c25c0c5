package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pgtender/pgtender/config"
)

// scramSecret formats a Postgres SCRAM-SHA-256 secret for password, with
// PBKDF2 and HMAC computed here, independently of the package code.
func scramSecret(tb testing.TB, password string, salt []byte, iters int) string {
	tb.Helper()
	salted, err := pbkdf2.Key(sha256.New, password, salt, iters, sha256.Size)
	if err != nil {
		tb.Fatal(err)
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	storedKey := sha256.Sum256(mac(salted, "Client Key"))
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iters, b64(salt), b64(storedKey[:]), b64(serverKey))
}

// md5Secret is Postgres's stored md5 hash: "md5" + hex(md5(password+user)).
func md5Secret(password, user string) string {
	sum := md5.Sum([]byte(password + user))
	return "md5" + hex.EncodeToString(sum[:])
}

func TestNewCredentialsKinds(t *testing.T) {
	validSCRAM := scramSecret(t, "pencil", []byte("0123456789abcdef"), 4096)
	hash := md5Secret("pencil", "alice")
	tests := []struct {
		name     string
		password string
		want     secretKind
	}{
		{"empty", "", kindNone},
		{"plaintext", "pencil", kindPlaintext},
		{"plaintext with dollar", "a$b:c", kindPlaintext},
		{"md5 hash", hash, kindMD5},
		{"md5 hash upper-case hex", "md5" + strings.ToUpper(hash[3:]), kindMD5},
		{"md5 prefix, 31 hex", hash[:len(hash)-1], kindPlaintext},
		{"md5 prefix, 33 hex", hash + "0", kindPlaintext},
		{"md5 prefix, not hex", hash[:len(hash)-1] + "g", kindPlaintext},
		{"MD5 prefix", "MD5" + hash[3:], kindPlaintext},
		{"scram secret", validSCRAM, kindSCRAM},
		{"scram secret, 1 iteration", scramSecret(t, "x", []byte("s"), 1), kindSCRAM},
		{"other SCRAM mechanism", "SCRAM-SHA-1$4096:c2FsdA==$a:b", kindPlaintext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustCredentials(t, "alice", tt.password)
			if c.kind != tt.want {
				t.Fatalf("kind = %s, want %s", c.kind, tt.want)
			}
			if (c.scramServer != nil) != (tt.want == kindPlaintext || tt.want == kindSCRAM) {
				t.Errorf("scramServer set = %v for kind %s", c.scramServer != nil, c.kind)
			}
		})
	}
}

func TestNewCredentialsMD5Folded(t *testing.T) {
	hash := md5Secret("pencil", "alice")
	upper := mustCredentials(t, "alice", "md5"+strings.ToUpper(hash[3:]))
	plain := mustCredentials(t, "alice", "pencil")
	if upper.md5Inner != plain.md5Inner {
		t.Fatalf("md5 inner of the hash %s != of the plaintext %s", upper.md5Inner, plain.md5Inner)
	}
}

func TestNewCredentialsMalformedSCRAM(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString
	key := b64(bytes.Repeat([]byte{7}, 32))
	salt := b64([]byte("NaCl-and-pepper!"))
	tests := []struct {
		name, secret, why string
	}{
		{"nothing", "SCRAM-SHA-256$", "no '$'"},
		{"no keys", "SCRAM-SHA-256$4096:" + salt, "no '$'"},
		{"no salt separator", "SCRAM-SHA-256$4096$" + key + ":" + key, "iteration count and the salt"},
		{"no key separator", "SCRAM-SHA-256$4096:" + salt + "$" + key + key, "StoredKey and ServerKey"},
		{"iterations empty", "SCRAM-SHA-256$:" + salt + "$" + key + ":" + key, "not a decimal"},
		{"iterations signed", "SCRAM-SHA-256$+4096:" + salt + "$" + key + ":" + key, "not a decimal"},
		{"iterations zero", "SCRAM-SHA-256$0:" + salt + "$" + key + ":" + key, "out of range"},
		{"iterations too big", "SCRAM-SHA-256$2147483648:" + salt + "$" + key + ":" + key, "out of range"},
		{"iterations overflow", "SCRAM-SHA-256$99999999999999999999999:" + salt + "$" + key + ":" + key, "out of range"},
		{"salt empty", "SCRAM-SHA-256$4096:$" + key + ":" + key, "salt"},
		{"salt not base64", "SCRAM-SHA-256$4096:!!!!$" + key + ":" + key, "salt"},
		{"stored key short", "SCRAM-SHA-256$4096:" + salt + "$" + b64([]byte("short")) + ":" + key, "StoredKey"},
		{"server key long", "SCRAM-SHA-256$4096:" + salt + "$" + key + ":" + b64(bytes.Repeat([]byte{1}, 33)), "ServerKey"},
		{"server key not base64", "SCRAM-SHA-256$4096:" + salt + "$" + key + ":" + key[:40] + "*" + key[41:], "ServerKey"},
		{"line break", "SCRAM-SHA-256$4096:" + salt + "$" + key[:20] + "\n" + key[20:] + ":" + key, "white space"},
		{"extra dollar", "SCRAM-SHA-256$4096:" + salt + "$" + key + ":" + key + "$x", "ServerKey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewCredentials("alice", tt.secret)
			if err == nil {
				t.Fatalf("NewCredentials accepted a malformed secret: %v", c)
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("error %q does not mention %q", err, tt.why)
			}
			if strings.Contains(err.Error(), key[:10]) || strings.Contains(err.Error(), salt[:10]) {
				t.Errorf("error %q contains part of the secret", err)
			}
		})
	}
}

func TestDerivedSCRAMKeys(t *testing.T) {
	a := mustCredentials(t, "alice", "pencil")
	b := mustCredentials(t, "alice", "pencil")
	if got := len(a.scram.Salt); got != 16 {
		t.Errorf("salt length = %d, want 16", got)
	}
	if a.scram.Iters != 4096 {
		t.Errorf("iterations = %d, want 4096", a.scram.Iters)
	}
	if a.scram.Salt == b.scram.Salt {
		t.Error("two derivations used the same salt")
	}
	// The same keys as an independent computation with a's salt.
	want := mustCredentials(t, "alice", scramSecret(t, "pencil", []byte(a.scram.Salt), 4096))
	if !bytes.Equal(a.scram.StoredKey, want.scram.StoredKey) || !bytes.Equal(a.scram.ServerKey, want.scram.ServerKey) {
		t.Fatal("derived SCRAM keys differ from an independent computation")
	}
}

func TestSASLPrep(t *testing.T) {
	tests := []struct{ in, want string }{
		{"pencil", "pencil"},
		{"with\x07bell", "with\x07bell"},           // ASCII is never touched (as pg_saslprep)
		{"I\u00adX", "IX"},                         // soft hyphen is mapped to nothing
		{"a\u00a0b", "a b"},                        // non-ASCII space becomes a space
		{"\u2168", "IX"},                           // NFKC: roman numeral nine
		{"priv\ue000ate", "priv\ue000ate"},         // prohibited: used as is
		{"bad\xffutf8\u00a0", "bad\xffutf8\u00a0"}, // invalid UTF-8: used as is
	}
	for _, tt := range tests {
		if got := saslPrep(tt.in); got != tt.want {
			t.Errorf("saslPrep(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestSupports(t *testing.T) {
	creds := map[secretKind]*Credentials{
		kindNone:      mustCredentials(t, "alice", ""),
		kindPlaintext: mustCredentials(t, "alice", "pencil"),
		kindMD5:       mustCredentials(t, "alice", md5Secret("pencil", "alice")),
		kindSCRAM:     mustCredentials(t, "alice", scramSecret(t, "pencil", []byte("salt"), 4096)),
	}
	ok := map[secretKind]map[config.AuthType]bool{
		kindNone:      {config.AuthTrust: true},
		kindPlaintext: {config.AuthTrust: true, config.AuthSCRAM: true, config.AuthMD5: true, config.AuthPlain: true},
		kindMD5:       {config.AuthTrust: true, config.AuthMD5: true, config.AuthPlain: true},
		kindSCRAM:     {config.AuthTrust: true, config.AuthSCRAM: true, config.AuthPlain: true},
	}
	for kind, c := range creds {
		for _, method := range []config.AuthType{config.AuthSCRAM, config.AuthMD5, config.AuthPlain, config.AuthTrust} {
			err := c.Supports(method)
			if want := ok[kind][method]; (err == nil) != want {
				t.Errorf("%s secret, auth_type %s: Supports = %v, want ok=%v", kind, method, err, want)
			}
			if err != nil && !errors.Is(err, ErrUnusableSecret) {
				t.Errorf("%s secret, auth_type %s: %v does not wrap ErrUnusableSecret", kind, method, err)
			}
		}
	}
	var nilCreds *Credentials
	if err := nilCreds.Supports(config.AuthTrust); err != nil {
		t.Errorf("nil credentials with trust: %v", err)
	}
	if err := nilCreds.Supports(config.AuthMD5); !errors.Is(err, ErrUnusableSecret) {
		t.Errorf("nil credentials with md5: %v, want ErrUnusableSecret", err)
	}
	if err := creds[kindPlaintext].Supports("kerberos"); err == nil || errors.Is(err, ErrUnusableSecret) {
		t.Errorf("unknown auth_type: %v, want a plain error", err)
	}
	// The message says what to do about it.
	err := creds[kindSCRAM].Supports(config.AuthMD5)
	if err == nil || !strings.Contains(err.Error(), "SCRAM-SHA-256 secret cannot answer an md5") {
		t.Errorf("SCRAM secret with md5: %v", err)
	}
}

func TestCredentialsNeverPrintSecrets(t *testing.T) {
	const password = "correct horse battery staple"
	secret := scramSecret(t, password, []byte("salt"), 4096)
	for _, in := range []string{password, md5Secret(password, "alice"), secret} {
		c := mustCredentials(t, "alice", in)
		forbidden := []string{password, in, in[3:], hex.EncodeToString(c.scram.StoredKey), base64.StdEncoding.EncodeToString(c.scram.StoredKey)}
		for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
			out := fmt.Sprintf(format, c)
			for _, f := range forbidden {
				if f != "" && strings.Contains(out, f) {
					t.Errorf("Sprintf(%q) = %q shows a secret", format, out)
				}
			}
			if !strings.Contains(out, `user="alice"`) {
				t.Errorf("Sprintf(%q) = %q, want the user", format, out)
			}
		}
	}
}
