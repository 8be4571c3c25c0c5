package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/pgtender/pgtender/internal/testcert"
)

// TestTLSFiles loads real certificate, key and CA files: a matching pair
// turns client TLS on (and with it the passthrough modes that need it); a
// key of another certificate, or a CA file without a certificate, is a
// problem at its key's line.
func TestTLSFiles(t *testing.T) {
	const db = "\n[[databases]]\nname = \"app\"\n"
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Issue(t, "127.0.0.1").WriteFiles(t, dir)
	caFile := ca.WriteFile(t, dir)
	files := "tls_certificate = " + quote(certFile) + "\ntls_private_key = " + quote(keyFile) + "\n"

	for _, mode := range []string{"enabled", "enabled_allow_change"} {
		cfg := mustLoad(t, "[general]\npassthrough_auth = \""+mode+"\"\ntls_client_required = true\n"+files+
			"tls_verify = \"verify_ca\"\ntls_server_ca_certificate = "+quote(caFile)+"\n"+db, nil)
		cert, err := cfg.General.LoadCertificate()
		if err != nil || cert == nil || cert.Leaf == nil || cert.Leaf.Subject.CommonName != "127.0.0.1" {
			t.Fatalf("LoadCertificate = %v, %v", cert, err)
		}
		if pool, err := cfg.General.LoadServerCA(); err != nil || pool == nil {
			t.Fatalf("LoadServerCA = %v, %v", pool, err)
		}
	}
	defaults := Defaults()
	if cert, err := defaults.General.LoadCertificate(); cert != nil || err != nil {
		t.Errorf("LoadCertificate without files = %v, %v; want nil, nil", cert, err)
	}

	otherDir := t.TempDir()
	_, otherKey := ca.Issue(t, "127.0.0.1").WriteFiles(t, otherDir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	checkProblems(t, loadProblems(t, "[general]\ntls_certificate = "+quote(certFile)+"\ntls_private_key = "+quote(otherKey)+
		"\ntls_server_ca_certificate = "+quote(notPEM)+"\n"+db, nil), []want{
		{"pgdog.toml", 2, "general.tls_certificate", "private key does not match public key"},
		{"pgdog.toml", 4, "general.tls_server_ca_certificate", "holds no PEM certificate"},
	})
}

func quote(s string) string { return `"` + s + `"` }
