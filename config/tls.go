package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// ClientTLS reports whether client-facing TLS is configured: both
// tls_certificate and tls_private_key are set.
func (g *General) ClientTLS() bool { return g.TLSCertificate != "" && g.TLSPrivateKey != "" }

// LoadCertificate reads tls_certificate and tls_private_key. It returns
// nil, nil when client TLS is not configured. Load checks the files once;
// the pooler reads them again at start and on every reload, so a reload
// picks up renewed files.
func (g *General) LoadCertificate() (*tls.Certificate, error) {
	if !g.ClientTLS() {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(g.TLSCertificate, g.TLSPrivateKey)
	if err != nil {
		return nil, fmt.Errorf("cannot load tls_certificate and tls_private_key: %w", err)
	}
	return &cert, nil
}

// LoadServerCA reads tls_server_ca_certificate, the CAs that verify
// Postgres's certificate under tls_verify "verify_ca" and "verify_full".
// It returns nil, nil when the key is not set: the system's roots are used.
func (g *General) LoadServerCA() (*x509.CertPool, error) {
	if g.TLSServerCACertificate == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(g.TLSServerCACertificate)
	if err != nil {
		return nil, fmt.Errorf("cannot read tls_server_ca_certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("tls_server_ca_certificate holds no PEM certificate")
	}
	return pool, nil
}
