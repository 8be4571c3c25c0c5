package config

import (
	"maps"
	"slices"
	"strings"
)

// PgDog keys pgtender does not implement yet. A key in one of these lists is
// reported as "not supported by pgtender yet" instead of "unknown key", so an
// operator moving a PgDog config sees which features are missing, by name.
// The lists follow pgdog-config/src (general.rs, core.rs, database.rs,
// users.rs) and /work/shared/reference/pgdog.md §2.

// unsupportedSections are top-level sections and arrays of pgdog.toml.
var unsupportedSections = setOf(
	"rewrite", "tcp", "multi_tenant", "plugins", "sharded_tables", "manual_queries",
	"omnisharded_tables", "sharded_mappings", "sharded_schemas", "replica_lag",
	"replication", "mirroring", "memory", "otel", "vault", "query_parsers", "fdw",
)

// unsupportedGeneral are [general] keys.
var unsupportedGeneral = setOf(
	// bans (of replicas, which pgtender does not balance across)
	"ban_timeout", "ban_replica_lag", "ban_replica_lag_bytes",
	// replicas, load balancing, query routing
	"load_balancing_strategy", "read_write_strategy", "read_write_split",
	"query_parser", "query_parser_enabled", "query_parser_engine", "regex_parser_limit",
	"query_cache_limit", "dry_run", "cross_shard_disabled", "system_catalogs",
	"omnisharded_sticky", "lsn_check_interval", "lsn_check_timeout", "lsn_check_delay",
	// re-planning renamed prepared statements after a while
	"prepared_statements_ttl", "prepared_statements_ttl_jitter",
	// TLS beyond a certificate, a key and a server CA
	"tls_client_ca_certificate", "tls_server_certificate", "tls_server_private_key",
	// connections and timeouts
	"connect_attempts", "connect_attempt_delay", "client_idle_timeout",
	"server_lifetime_jitter", "shutdown_termination_timeout", "dns_ttl",
	"connection_recovery", "client_connection_recovery",
	// features
	"pub_sub_channel_size", "query_log", "expanded_explain",
	"mirror_queue", "mirror_exposure", "broadcast_address", "broadcast_port",
	"log_dedup_window", "log_dedup_threshold",
	"two_phase_commit", "two_phase_commit_auto", "two_phase_commit_wal_dir",
	"two_phase_commit_wal_segment_size", "two_phase_commit_wal_fsync_interval",
	"two_phase_commit_wal_checkpoint_interval",
	"unique_id_min", "unique_id_function",
	"resharding_copy_format", "resharding_parallel_copies",
	"resharding_copy_retry_max_attempts", "resharding_copy_retry_min_delay",
	"reload_schema_on_ddl", "load_schema",
	"cutover_traffic_stop_threshold", "cutover_replication_lag_threshold",
	"cutover_last_transaction_delay", "cutover_timeout", "cutover_timeout_action",
	"cutover_save_config",
	"jwt_server_user", "jwt_server_password", "jwt_user_auto_provision_read_only",
)

// unsupportedDatabase are [[databases]] keys. role = "primary" and shard = 0
// are accepted: they say what pgtender does anyway (see loader.databaseKey).
var unsupportedDatabase = setOf(
	"role", "shard", "lb_weight", "read_only", "statement_timeout", "lock_timeout",
	"idle_timeout", "server_lifetime", "server_lifetime_jitter", "resharding_only",
)

// unsupportedUser are users.toml [[users]] keys.
var unsupportedUser = setOf(
	"databases", "all_databases", "passwords", "password_hash", "identity",
	"tls_client_certificate_required", "server_auth", "server_iam_region", "vault_path",
	"server_vault_path", "vault_refresh_percent", "statement_timeout", "lock_timeout",
	"read_only", "idle_timeout", "server_lifetime", "server_lifetime_jitter",
	"replication_mode", "replication_sharding", "schema_admin", "cross_shard_disabled",
	"two_phase_commit", "two_phase_commit_auto",
)

// UnsupportedKeys lists, by section ("sections", "general", "databases",
// "users"), the PgDog keys pgtender reports as not supported yet. It is a
// copy; docs and --check-config tooling may print it.
func UnsupportedKeys() map[string][]string {
	return map[string][]string{
		"sections":  sortedSet(unsupportedSections),
		"general":   sortedSet(unsupportedGeneral),
		"databases": sortedSet(unsupportedDatabase),
		"users":     sortedSet(unsupportedUser),
	}
}

// PlannedKey is a key pgtender reads and checks but whose feature is not
// built yet. Keys are accepted at their default, so a file written for a
// later pgtender still loads when it does not use the feature; any other
// value is a problem, never silently ignored.
type PlannedKey struct {
	Key     string // key path, as in problems: "general.query_timeout"
	Default string // its default, as TOML text: `0`, `""`, `"disabled"`
	// NotYet maps each value not in effect yet (as TOML text) to what to
	// write instead. Empty: every value but Default is not in effect yet.
	NotYet map[string]string
	Why    string // what is missing, for messages and docs
}

// notInEffect lists the keys pgtender reads whose feature is not built yet.
// A key set to a value not in effect is reported at its line as "not
// supported by pgtender yet (planned: Why)". Remove an entry in the change
// that builds its feature (and its row in docs/configuration.md, "Read but
// not in effect yet", and from notInEffectRejected in planned_test.go;
// TestDocsListKeysNotInEffect and TestNotInEffect check they agree).
var notInEffect = []PlannedKey{}

// NotInEffectKeys returns the keys pgtender reads but whose feature is not
// built yet (see PlannedKey), in key order. It is a copy.
func NotInEffectKeys() []PlannedKey {
	out := make([]PlannedKey, len(notInEffect))
	for i, k := range notInEffect {
		k.NotYet = maps.Clone(k.NotYet)
		out[i] = k
	}
	slices.SortFunc(out, func(a, b PlannedKey) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func setOf(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}
