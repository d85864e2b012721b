// Package tlstest makes a throwaway certificate authority for walrelay's
// TLS tests: a CA, a server certificate for the names and addresses a test
// gives, and a client certificate, written as PEM files into a directory.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Certs are the PEM files of a CA, a server and a client certificate.
type Certs struct {
	CAFile                string // the CA certificate
	ServerCert, ServerKey string // the server's certificate and key
	ClientCert, ClientKey string // a client certificate, for mutual TLS
	pool                  *x509.CertPool
	server, client        tls.Certificate
}

// New writes a fresh CA, a server certificate valid for hosts (DNS names or
// IP addresses) and a client certificate into dir.
func New(dir string, hosts ...string) (*Certs, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "walrelay test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("sign CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	c := &Certs{
		CAFile:     filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.crt"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.crt"), ClientKey: filepath.Join(dir, "client.key"),
		pool: x509.NewCertPool(),
	}
	c.pool.AddCert(ca)
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, certFile, keyFile string) (tls.Certificate, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("generate key: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if usage == x509.ExtKeyUsageServerAuth {
			for _, h := range hosts {
				if ip := net.ParseIP(h); ip != nil {
					tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
				} else {
					tmpl.DNSNames = append(tmpl.DNSNames, h)
				}
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("sign %s: %w", cn, err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return tls.Certificate{}, err
		}
		if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
			return tls.Certificate{}, err
		}
		if err := writePEM(keyFile, "EC PRIVATE KEY", keyDER); err != nil {
			return tls.Certificate{}, err
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
	}
	if c.server, err = leaf(2, "walrelay test server", x509.ExtKeyUsageServerAuth, c.ServerCert, c.ServerKey); err != nil {
		return nil, err
	}
	if c.client, err = leaf(3, "walrelay", x509.ExtKeyUsageClientAuth, c.ClientCert, c.ClientKey); err != nil {
		return nil, err
	}
	return c, nil
}

// ServerConfig is a TLS server configuration with the server certificate;
// with requireClientCert it asks for a client certificate of the CA.
func (c *Certs) ServerConfig(requireClientCert bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{c.server}, MinVersion: tls.VersionTLS12}
	if requireClientCert {
		cfg.ClientAuth, cfg.ClientCAs = tls.RequireAndVerifyClientCert, c.pool
	}
	return cfg
}

// ClientConfig trusts the CA and, with withCert, presents the client
// certificate.
func (c *Certs) ClientConfig(withCert bool) *tls.Config {
	cfg := &tls.Config{RootCAs: c.pool, MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{c.client}
	}
	return cfg
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
