package auth

import (
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/pgtender/pgtender/config"
	"github.com/xdg-go/scram"
	"github.com/xdg-go/stringprep"
)

// ErrUnusableSecret means the configured secret cannot serve the auth
// method: an md5 hash cannot answer a SCRAM exchange, a SCRAM secret cannot
// answer an md5 challenge, and an empty password serves only trust. It is a
// configuration problem: the pooler logs it and the client gets 28P01.
var ErrUnusableSecret = errors.New("auth: the configured password cannot serve this auth_type")

const (
	// scramPrefix starts a SCRAM secret as Postgres stores it in pg_authid.
	scramPrefix = "SCRAM-SHA-256$"
	// scramIterations is the PBKDF2 iteration count used for secrets
	// derived from a plaintext password: Postgres's default scram_iterations.
	scramIterations = 4096
	// scramSaltLen is the salt length used for derived secrets, as Postgres
	// (SCRAM_DEFAULT_SALT_LEN).
	scramSaltLen = 16
	// md5HexLen is the length of an md5 digest in hex.
	md5HexLen = 2 * md5.Size
)

// secretKind is what a users.toml password turned out to be.
type secretKind uint8

const (
	kindNone      secretKind = iota // empty password: trust only
	kindPlaintext                   // serves every method
	kindMD5                         // "md5" + hex: serves md5 and plain
	kindSCRAM                       // SCRAM-SHA-256 secret: serves scram and plain
)

func (k secretKind) String() string {
	switch k {
	case kindNone:
		return "none"
	case kindPlaintext:
		return "plaintext"
	case kindMD5:
		return "md5"
	case kindSCRAM:
		return "scram-sha-256"
	}
	return "secretKind(" + strconv.Itoa(int(k)) + ")"
}

// Credentials are a configured user's secrets, derived once at config load.
// A *Credentials is immutable and safe for concurrent use by any number of
// logins. Its String and GoString forms never show a secret.
type Credentials struct {
	kind secretKind
	user string

	// plainDigest is sha256(plaintext), kindPlaintext only: plain auth
	// compares digests so the comparison does not leak the length.
	plainDigest [sha256.Size]byte

	// md5Inner is hex(md5(password + user)), the secret of the md5
	// exchange (kindPlaintext and kindMD5).
	md5Inner [md5HexLen]byte

	// scram holds the salt, iterations, StoredKey and ServerKey
	// (kindPlaintext and kindSCRAM); scramServer is an xdg-go server whose
	// credential lookup returns them, whatever name the client sends.
	scram       scram.StoredCredentials
	scramServer *scram.Server
}

// NewCredentials parses a users.toml password for role user: plaintext, an
// md5 hash "md5" + 32 hex digits (md5(password + user); upper-case hex is
// accepted and folded), or a SCRAM secret
// "SCRAM-SHA-256$<iterations>:<salt base64>$<StoredKey base64>:<ServerKey base64>".
// A plaintext password gets SCRAM keys derived here, with a random 16-byte
// salt and 4096 iterations as Postgres does, so that logins only compute
// HMACs. An empty password yields credentials that serve only trust.
//
// A string that starts with "SCRAM-SHA-256$" but is malformed is an error
// (it is a broken secret, not a password); the error never contains it.
func NewCredentials(user, password string) (*Credentials, error) {
	c := &Credentials{user: user}
	switch {
	case password == "":
		c.kind = kindNone
		return c, nil
	case strings.HasPrefix(password, scramPrefix):
		sc, err := parseSCRAMSecret(password)
		if err != nil {
			return nil, err
		}
		c.kind = kindSCRAM
		c.scram = sc
	case isMD5Hash(password):
		c.kind = kindMD5
		for i := range md5HexLen {
			c.md5Inner[i] = lowerHex(password[len("md5")+i])
		}
	default:
		c.kind = kindPlaintext
		c.plainDigest = sha256.Sum256([]byte(password))
		c.md5Inner = md5Hex(password + user)
		salt := make([]byte, scramSaltLen)
		if _, err := rand.Read(salt); err != nil {
			return nil, fmt.Errorf("auth: generating a SCRAM salt: %w", err)
		}
		sc, err := deriveSCRAM(password, string(salt), scramIterations)
		if err != nil {
			return nil, err
		}
		c.scram = sc
	}
	if c.kind == kindPlaintext || c.kind == kindSCRAM {
		stored := c.scram
		// The lookup ignores the name: Postgres clients send an empty one
		// (n=) because the role is already in the startup packet.
		server, err := scram.SHA256.NewServer(func(string) (scram.StoredCredentials, error) {
			return stored, nil
		})
		if err != nil {
			return nil, fmt.Errorf("auth: creating the SCRAM server: %w", err)
		}
		c.scramServer = server
	}
	return c, nil
}

// String describes c without any secret, e.g. auth.Credentials{user="app" secret=scram-sha-256}.
func (c *Credentials) String() string {
	if c == nil {
		return "auth.Credentials(nil)"
	}
	return fmt.Sprintf("auth.Credentials{user=%q secret=%s}", c.user, c.kind)
}

// GoString is String, so %#v cannot print the secrets either.
func (c *Credentials) GoString() string { return c.String() }

// Supports reports whether c can serve method: nil, or an error wrapping
// ErrUnusableSecret saying why not. The pooler (or --check-config) can call it
// at load time so the problem is reported before any client logs in.
func (c *Credentials) Supports(method config.AuthType) error {
	if method == config.AuthTrust {
		return nil
	}
	switch method {
	case config.AuthSCRAM, config.AuthMD5, config.AuthPlain:
	default:
		return fmt.Errorf("auth: unknown auth_type %q", method)
	}
	kind := kindNone
	if c != nil {
		kind = c.kind
	}
	switch {
	case kind == kindNone:
		return fmt.Errorf("%w: no password is configured for the user (auth_type %s needs one)", ErrUnusableSecret, method)
	case kind == kindMD5 && method == config.AuthSCRAM:
		return fmt.Errorf("%w: an md5 hash cannot answer SCRAM-SHA-256 (auth_type scram needs the plaintext password or a SCRAM-SHA-256 secret)", ErrUnusableSecret)
	case kind == kindSCRAM && method == config.AuthMD5:
		return fmt.Errorf("%w: a SCRAM-SHA-256 secret cannot answer an md5 challenge (auth_type md5 needs the plaintext password or an md5 hash)", ErrUnusableSecret)
	}
	return nil
}

// parseSCRAMSecret parses Postgres's pg_authid SCRAM format. Errors name the
// part that is wrong, never its value.
func parseSCRAMSecret(s string) (scram.StoredCredentials, error) {
	malformed := func(why string) (scram.StoredCredentials, error) {
		return scram.StoredCredentials{}, fmt.Errorf(
			"auth: malformed SCRAM-SHA-256 secret: %s (want SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, base64)", why)
	}
	rest := s[len(scramPrefix):]
	// base64 decoding skips line breaks; a secret has no space of any kind.
	if strings.ContainsAny(rest, " \t\r\n\v\f") {
		return malformed("it contains white space")
	}
	factors, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return malformed("no '$' between the key factors and the keys")
	}
	iterText, saltText, ok := strings.Cut(factors, ":")
	if !ok {
		return malformed("no ':' between the iteration count and the salt")
	}
	storedText, serverText, ok := strings.Cut(keys, ":")
	if !ok {
		return malformed("no ':' between StoredKey and ServerKey")
	}
	if iterText == "" || strings.Trim(iterText, "0123456789") != "" {
		return malformed("the iteration count is not a decimal number")
	}
	iters, err := strconv.Atoi(iterText)
	if err != nil || iters < 1 || iters > math.MaxInt32 {
		return malformed("the iteration count is out of range (1 to 2147483647)")
	}
	b64 := base64.StdEncoding.Strict()
	salt, err := b64.DecodeString(saltText)
	if err != nil || len(salt) == 0 {
		return malformed("the salt is not non-empty base64")
	}
	storedKey, err := b64.DecodeString(storedText)
	if err != nil || len(storedKey) != sha256.Size {
		return malformed("StoredKey is not 32 bytes of base64")
	}
	serverKey, err := b64.DecodeString(serverText)
	if err != nil || len(serverKey) != sha256.Size {
		return malformed("ServerKey is not 32 bytes of base64")
	}
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(salt), Iters: iters},
		StoredKey:  storedKey,
		ServerKey:  serverKey,
	}, nil
}

// deriveSCRAM computes the SCRAM-SHA-256 keys of password as Postgres does
// (pg_be_scram_build_secret): SASLprep the password, falling back to the raw
// bytes when SASLprep refuses it, then PBKDF2-HMAC-SHA-256.
func deriveSCRAM(password, salt string, iters int) (scram.StoredCredentials, error) {
	salted, err := saltedPassword(password, salt, iters)
	if err != nil {
		return scram.StoredCredentials{}, err
	}
	clientKey := hmacSHA256(salted, "Client Key")
	storedKey := sha256.Sum256(clientKey)
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: salt, Iters: iters},
		StoredKey:  storedKey[:],
		ServerKey:  hmacSHA256(salted, "Server Key"),
	}, nil
}

// verifySCRAMPlain reports whether a cleartext password matches a SCRAM
// secret (Postgres's scram_verify_plain_password). It costs one PBKDF2.
func verifySCRAMPlain(stored scram.StoredCredentials, password string) (bool, error) {
	salted, err := saltedPassword(password, stored.Salt, stored.Iters)
	if err != nil {
		return false, err
	}
	storedKey := sha256.Sum256(hmacSHA256(salted, "Client Key"))
	return hmac.Equal(storedKey[:], stored.StoredKey), nil
}

func saltedPassword(password, salt string, iters int) ([]byte, error) {
	salted, err := pbkdf2.Key(sha256.New, saslPrep(password), []byte(salt), iters, sha256.Size)
	if err != nil {
		return nil, fmt.Errorf("auth: deriving SCRAM keys: %w", err)
	}
	return salted, nil
}

// saslPrep normalizes a password as Postgres's pg_saslprep does for SCRAM:
// ASCII is left alone, anything else goes through SASLprep (RFC 4013), and a
// password SASLprep refuses (invalid UTF-8, prohibited characters) is used
// as it is.
func saslPrep(password string) string {
	ascii := true
	for i := 0; i < len(password); i++ {
		if password[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return password
	}
	prepped, err := stringprep.SASLprep.Prepare(password)
	if err != nil {
		return password
	}
	return prepped
}

func hmacSHA256(key []byte, data string) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(data))
	return mac.Sum(nil)
}

// md5Hex returns hex(md5(s)) in lower case.
func md5Hex(s string) [md5HexLen]byte {
	sum := md5.Sum([]byte(s))
	var out [md5HexLen]byte
	hex.Encode(out[:], sum[:])
	return out
}

// isMD5Hash reports whether s is "md5" followed by 32 hex digits.
func isMD5Hash(s string) bool {
	if len(s) != len("md5")+md5HexLen || !strings.HasPrefix(s, "md5") {
		return false
	}
	for i := len("md5"); i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func lowerHex(c byte) byte {
	if 'A' <= c && c <= 'F' {
		return c + ('a' - 'A')
	}
	return c
}
