// Package testcert makes a throwaway certificate authority and the
// certificates it signs, at test time, with crypto/x509: nothing is
// checked in, and nothing outlives the test.
//
//	ca := testcert.NewCA(t)
//	leaf := ca.Issue(t, "127.0.0.1", "localhost")   // IP and DNS names
//	certFile, keyFile := leaf.WriteFiles(t, t.TempDir())
//	roots := ca.Pool()                               // to trust it
//
// Keys are ECDSA P-256, which is quick to generate and which Postgres,
// libpq and crypto/tls all accept.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// serial numbers certificates within a test process, so each one is told
// apart by its serial.
var serial atomic.Int64

// CA is a self-signed certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	key     *ecdsa.PrivateKey
}

// Leaf is a certificate signed by a CA, with its private key.
type Leaf struct {
	Cert    *x509.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// NewCA makes a certificate authority valid from an hour ago for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	template := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: "pgtender test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	return &CA{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), key: key}
}

// Issue signs a server certificate for names: each is an IP address
// SAN when it parses as one, else a DNS SAN. The first name is also the
// subject's common name.
func (ca *CA) Issue(t testing.TB, names ...string) *Leaf {
	t.Helper()
	key := newKey(t)
	template := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if len(names) > 0 {
		template.Subject.CommonName = names[0]
	}
	for _, name := range names {
		if ip := net.ParseIP(name); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	return &Leaf{Cert: cert, CertPEM: pemBlock("CERTIFICATE", der), KeyPEM: pemBlock("PRIVATE KEY", keyDER)}
}

// Pool is a certificate pool holding only the CA, for tls.Config.RootCAs.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// WriteFile writes the CA certificate (PEM) to dir/ca.crt and returns the
// path.
func (ca *CA) WriteFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ca.crt")
	write(t, path, ca.CertPEM)
	return path
}

// WriteFiles writes the certificate and its key (PEM, the key readable by
// its owner only, as Postgres demands) to dir/server.crt and dir/server.key
// and returns the paths. Files already there are replaced.
func (l *Leaf) WriteFiles(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile = filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	write(t, certFile, l.CertPEM)
	write(t, keyFile, l.KeyPEM)
	return certFile, keyFile
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	return key
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func write(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatalf("testcert: %v", err)
	}
}
