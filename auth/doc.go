// Package auth is the server side of client authentication in pgtender.
//
// It has two halves.
//
// Configured users (users.toml) log in with AuthenticateClient, which runs
// one of the Postgres authentication exchanges over a ClientConn the pooler
// implements on its framer:
//
//   - scram: SCRAM-SHA-256 (RFC 5802, RFC 7677) without channel binding. The
//     server advertises only "SCRAM-SHA-256", never "-PLUS". The keys are
//     derived once, when the configuration is loaded (NewCredentials), so a
//     login costs a few HMACs instead of 4096 PBKDF2 rounds.
//   - md5: Postgres's salted md5 challenge.
//   - plain: the client sends its password in clear (use TLS).
//   - trust: no exchange at all.
//
// A users.toml password is plaintext, an md5 hash ("md5" + 32 hex digits of
// md5(password + user)) or a SCRAM secret in Postgres's pg_authid format
// ("SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>"). Plaintext
// serves every method; an md5 hash serves md5 and plain; a SCRAM secret
// serves scram and plain (plain then costs one PBKDF2 per login, as it does
// in Postgres). A combination that cannot work (a SCRAM secret with
// auth_type md5, an md5 hash with auth_type scram) fails with an error
// wrapping ErrUnusableSecret, which Credentials.Supports reports at config
// load time too.
//
// Passthrough users (passthrough_auth) send their password in clear
// (ReadCleartextPassword) and are admitted by a Registry: immutable
// snapshots of the passwords Postgres has accepted, split into shards each
// behind an atomic pointer, so the common case, a known user with the
// known password, takes no lock and allocates nothing, and a write copies
// one shard. A password the registry does not know is verified against
// Postgres, by a function the pooler provides, before it is admitted;
// passwords Postgres rejected are remembered briefly (a negative cache),
// failed verifications are limited per user and per client address, and a
// stored password is checked against Postgres again, in the background,
// once it is older than the reverify interval.
//
// Errors: ErrPasswordMismatch (the client gets FATAL 28P01), ErrThrottled
// and ErrCachedRejection (both wrap ErrPasswordMismatch: 28P01 too,
// counted and logged apart), ErrProtocol (the
// client broke the exchange: FATAL 08P01), ErrUnusableSecret (configuration:
// logged, and the client gets 28P01). Passwords never appear in errors or in
// the String form of any value of this package.
package auth
