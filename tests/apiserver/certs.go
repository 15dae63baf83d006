package apiserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pkiFiles are the key material one server instance uses; it survives API
// server restarts so clients and tokens stay valid.
type pkiFiles struct {
	caCert      string
	caPEM       []byte
	servingCert string
	servingKey  string
	saKey       string // RSA private key: signs and verifies SA tokens
}

// generatePKI writes a throwaway CA, a serving certificate for the loopback
// addresses and the in-cluster names, and a service account signing key.
func generatePKI(dir string) (pkiFiles, error) {
	files := pkiFiles{
		caCert:      filepath.Join(dir, "ca.crt"),
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saKey:       filepath.Join(dir, "sa.key"),
	}
	now := time.Now()

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, fmt.Errorf("generating CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "xdplb-test-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return files, fmt.Errorf("signing CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return files, fmt.Errorf("parsing CA certificate: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return files, fmt.Errorf("generating serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default",
			"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return files, fmt.Errorf("signing serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return files, fmt.Errorf("encoding serving key: %w", err)
	}

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return files, fmt.Errorf("generating service account key: %w", err)
	}
	saDER, err := x509.MarshalPKCS8PrivateKey(saKey)
	if err != nil {
		return files, fmt.Errorf("encoding service account key: %w", err)
	}

	files.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{files.caCert, files.caPEM, 0o644},
		{files.servingCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644},
		{files.servingKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600},
		{files.saKey, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: saDER}), 0o600},
	} {
		if err := os.WriteFile(f.path, f.data, f.mode); err != nil {
			return files, fmt.Errorf("writing %s: %w", filepath.Base(f.path), err)
		}
	}
	return files, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		// crypto/rand does not fail on Linux; a fixed serial is still valid.
		return big.NewInt(1)
	}
	return n
}

// randomToken returns 32 random bytes, hex encoded.
func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating token: %w", err)
	}
	return hex.EncodeToString(b), nil
}
