package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/xdplb/xdplb/tests/apiserver/k8sbin"
	"github.com/xdplb/xdplb/tests/child"
)

// EnvCI, set to 1, turns a missing or unbuildable binary into a test
// failure instead of a skip.
const EnvCI = "XDPLB_CI"

// DefaultReadyTimeout bounds the wait for etcd and for kube-apiserver to
// become ready.
const DefaultReadyTimeout = 60 * time.Second

// Option adjusts [Start].
type Option func(*options)

type options struct {
	users        []user
	extraArgs    []string
	readyTimeout time.Duration
	cpus         []int
}

type user struct {
	name   string
	groups []string
}

// WithUser adds a static token user (in --token-auth-file, which the API
// server reads only at start). [Server.User] returns its credentials. The
// user has no permissions beyond those RBAC grants every authenticated user
// until a test binds it to a role.
func WithUser(name string, groups ...string) Option {
	return func(o *options) { o.users = append(o.users, user{name: name, groups: groups}) }
}

// WithAPIServerArgs appends kube-apiserver flags; a later flag overrides an
// earlier one of the same name.
func WithAPIServerArgs(args ...string) Option {
	return func(o *options) { o.extraArgs = append(o.extraArgs, args...) }
}

// WithCPUs binds etcd and kube-apiserver to cpus (see [child.StartOn]),
// keeping them off the others.
func WithCPUs(cpus ...int) Option {
	return func(o *options) { o.cpus = cpus }
}

// WithReadyTimeout replaces [DefaultReadyTimeout].
func WithReadyTimeout(d time.Duration) Option {
	return func(o *options) { o.readyTimeout = d }
}

// Server is a running etcd and kube-apiserver pair. Its methods are safe for
// concurrent use.
type Server struct {
	bins         k8sbin.Binaries
	dir          string
	pki          pkiFiles
	readyTimeout time.Duration
	extraArgs    []string
	cpus         []int // etcd's and kube-apiserver's CPUs; none: any

	// Fixed once started: the API server keeps its port across restarts.
	port            int
	url             string
	etcdURL         string
	adminToken      string
	userTokens      map[string]string
	tokenFile       string
	adminKubeconfig string
	client          *kubernetes.Clientset

	mu        sync.Mutex
	etcd      *child.Process
	apiserver *child.Process
}

// RequireBinaries returns the etcd and kube-apiserver binaries, building
// them if needed. When they cannot be had it fails the test if XDPLB_CI=1
// and skips it otherwise; with -short it skips rather than start a build.
func RequireBinaries(t testing.TB) k8sbin.Binaries {
	t.Helper()
	if b, ok := k8sbin.Cached(); ok {
		return b
	}
	ci := os.Getenv(EnvCI) == "1"
	if testing.Short() && !ci {
		t.Skipf("kube-apiserver %s / etcd %s not built and -short is set; build them with tests/apiserver/build.sh",
			k8sbin.KubernetesVersion, k8sbin.EtcdVersion)
	}
	ctx := t.Context()
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			// Leave time to report instead of dying in the test timeout.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-30*time.Second))
			defer cancel()
		}
	}
	b, err := k8sbin.Ensure(ctx)
	if err != nil {
		if ci {
			t.Fatalf("building kube-apiserver/etcd for tests: %v", err)
		}
		t.Skipf("kube-apiserver/etcd unavailable (set %s=1 to make this fatal): %v", EnvCI, err)
	}
	return b
}

// Start runs etcd and kube-apiserver on free loopback ports with their
// data under t.TempDir(), waits until both are ready, and stops both when
// the test ends. It fails the test if they do not come up; see
// [RequireBinaries] for when it skips instead.
//
// The API server authenticates static tokens (an admin in system:masters,
// and users added with [WithUser]) and service account tokens, authorizes
// with RBAC alone, serves 10.96.0.0/16 as the Service range and runs no
// endpoint reconciler, so the default/kubernetes Service has no endpoints.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := options{readyTimeout: DefaultReadyTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	bins := RequireBinaries(t)
	s := &Server{
		bins:         bins,
		dir:          t.TempDir(),
		readyTimeout: o.readyTimeout,
		cpus:         o.cpus,
		extraArgs:    o.extraArgs,
		userTokens:   make(map[string]string),
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.logTails(t)
		}
		if err := s.stopAll(); err != nil {
			t.Errorf("stopping test API server: %v", err)
		}
	})
	if err := s.start(t.Context(), o.users); err != nil {
		t.Fatalf("starting test API server: %v", err)
	}
	return s
}

func (s *Server) start(ctx context.Context, users []user) error {
	for _, sub := range []string{"pki", "etcd", "logs", "kubeconfigs", "cert-dir"} {
		if err := os.MkdirAll(filepath.Join(s.dir, sub), 0o700); err != nil {
			return fmt.Errorf("creating %s directory: %w", sub, err)
		}
	}
	var err error
	if s.pki, err = generatePKI(filepath.Join(s.dir, "pki")); err != nil {
		return err
	}
	if err := s.writeTokenFile(users); err != nil {
		return err
	}
	if err := s.startEtcd(ctx); err != nil {
		return err
	}
	if err := s.startAPIServerFresh(ctx); err != nil {
		return err
	}
	cfg := s.AdminConfig()
	if s.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("creating admin client: %w", err)
	}
	if s.adminKubeconfig, err = s.writeKubeconfig("admin", cfg); err != nil {
		return err
	}
	return nil
}

func (s *Server) writeTokenFile(users []user) error {
	var sb strings.Builder
	tok, err := randomToken()
	if err != nil {
		return err
	}
	s.adminToken = tok
	fmt.Fprintf(&sb, "%s,%s,%s,%q\n", tok, AdminUser, AdminUser, "system:masters")
	for _, u := range users {
		if u.name == "" || strings.ContainsAny(u.name+strings.Join(u.groups, ""), ",\"\n") {
			return fmt.Errorf("invalid token user %q / groups %q", u.name, u.groups)
		}
		if _, dup := s.userTokens[u.name]; dup || u.name == AdminUser {
			return fmt.Errorf("token user %q declared twice", u.name)
		}
		tok, err := randomToken()
		if err != nil {
			return err
		}
		s.userTokens[u.name] = tok
		fmt.Fprintf(&sb, "%s,%s,%s", tok, u.name, u.name)
		if len(u.groups) > 0 {
			fmt.Fprintf(&sb, ",%q", strings.Join(u.groups, ","))
		}
		sb.WriteString("\n")
	}
	s.tokenFile = filepath.Join(s.dir, "pki", "tokens.csv")
	if err := os.WriteFile(s.tokenFile, []byte(sb.String()), 0o600); err != nil {
		return fmt.Errorf("writing token file: %w", err)
	}
	return nil
}

// AdminUser is the name of the static admin token user (in system:masters).
const AdminUser = "xdplb-test-admin"

const startAttempts = 3

func (s *Server) startEtcd(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		clientPort, err := freePort()
		if err != nil {
			return err
		}
		peerPort, err := freePort()
		if err != nil {
			return err
		}
		clientURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
		peerURL := "http://127.0.0.1:" + strconv.Itoa(peerPort)
		args := []string{
			"--name=xdplb-test",
			"--data-dir=" + filepath.Join(s.dir, "etcd"),
			"--listen-client-urls=" + clientURL,
			"--advertise-client-urls=" + clientURL,
			"--listen-peer-urls=" + peerURL,
			"--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=xdplb-test=" + peerURL,
			"--initial-cluster-state=new",
			"--log-level=warn",
			// Throwaway data: durability is not worth fsync latency on a
			// busy machine.
			"--unsafe-no-fsync",
		}
		p, err := child.StartOn("etcd", exec.Command(s.bins.Etcd, args...), filepath.Join(s.dir, "logs", "etcd.log"), s.cpus)
		if err != nil {
			return err
		}
		err = s.waitReady(ctx, p, clientURL+"/health", "", func(body string) bool {
			return strings.Contains(body, `"health":"true"`)
		})
		if err == nil {
			s.mu.Lock()
			s.etcd, s.etcdURL = p, clientURL
			s.mu.Unlock()
			return nil
		}
		_ = stopChild(p, 5*time.Second)
		if !errors.Is(err, errPortTaken) {
			return fmt.Errorf("etcd: %w", err)
		}
		lastErr = err
		// The data dir may be half initialised by the failed attempt.
		if err := os.RemoveAll(filepath.Join(s.dir, "etcd")); err != nil {
			return fmt.Errorf("resetting etcd data dir: %w", err)
		}
	}
	return fmt.Errorf("etcd: %w", lastErr)
}

// startAPIServerFresh picks the API server's port, retrying on a lost race
// for it; restarts reuse the port.
func (s *Server) startAPIServerFresh(ctx context.Context) error {
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		s.port = port
		s.url = "https://127.0.0.1:" + strconv.Itoa(port)
		err = s.StartAPIServer(ctx)
		if err == nil || !errors.Is(err, errPortTaken) {
			return err
		}
		lastErr = err
	}
	return lastErr
}

func (s *Server) apiServerArgs() []string {
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.port),
		"--tls-cert-file=" + s.pki.servingCert,
		"--tls-private-key-file=" + s.pki.servingKey,
		// Unused with the files above, but keeps the default
		// /var/run/kubernetes out of the picture.
		"--cert-dir=" + filepath.Join(s.dir, "cert-dir"),
		"--token-auth-file=" + s.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + s.pki.saKey,
		"--service-account-signing-key-file=" + s.pki.saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// No controllers run: nothing would maintain the kubernetes
		// Service's endpoints, and the ServiceAccount admission plugin
		// would reject every Pod until a controller made the default
		// ServiceAccount of its namespace.
		"--endpoint-reconciler-type=none",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}
	return append(args, s.extraArgs...)
}

// StartAPIServer starts kube-apiserver again after [Server.StopAPIServer],
// on the same port with the same credentials, and waits until it is ready.
// etcd's data is untouched, so clients see the same objects.
func (s *Server) StartAPIServer(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiserver != nil && !s.apiserver.Exited() {
		return errors.New("kube-apiserver is already running")
	}
	p, err := child.StartOn("kube-apiserver", exec.Command(s.bins.KubeAPIServer, s.apiServerArgs()...),
		filepath.Join(s.dir, "logs", "kube-apiserver.log"), s.cpus)
	if err != nil {
		return err
	}
	if err := s.waitReady(ctx, p, s.url+"/readyz", s.adminToken, nil); err != nil {
		_ = stopChild(p, 5*time.Second)
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	s.apiserver = p
	return nil
}

// StopAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after 15 s) and
// leaves etcd running. Clients get connection errors until
// [Server.StartAPIServer].
func (s *Server) StopAPIServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiserver == nil {
		return nil
	}
	err := stopChild(s.apiserver, 15*time.Second)
	s.apiserver = nil
	return err
}

// KillAPIServer ends kube-apiserver with SIGKILL, as a crash would: open
// connections and watches break without a graceful close. etcd keeps
// running; [Server.StartAPIServer] brings the API server back.
func (s *Server) KillAPIServer() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.apiserver == nil {
		return nil
	}
	err := stopChild(s.apiserver, 0)
	s.apiserver = nil
	return err
}

// RestartAPIServer is [Server.StopAPIServer] followed by
// [Server.StartAPIServer].
func (s *Server) RestartAPIServer(ctx context.Context) error {
	if err := s.StopAPIServer(); err != nil {
		return err
	}
	return s.StartAPIServer(ctx)
}

func (s *Server) stopAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.apiserver != nil {
		errs = append(errs, stopChild(s.apiserver, 15*time.Second))
		s.apiserver = nil
	}
	if s.etcd != nil {
		errs = append(errs, stopChild(s.etcd, 10*time.Second))
		s.etcd = nil
	}
	return errors.Join(errs...)
}

// logTails logs the end of both server logs, for a failed test.
func (s *Server) logTails(t testing.TB) {
	for _, name := range []string{"etcd", "kube-apiserver"} {
		t.Logf("last lines of %s log:\n%s", name, child.FileTail(filepath.Join(s.dir, "logs", name+".log"), 30))
	}
}

// waitReady polls url until it answers 200 (and ok accepts the body, if
// given), the process exits, ctx ends or the ready timeout passes. Errors
// carry the tail of the process log; one wrapping errPortTaken means a retry
// with another port may succeed.
func (s *Server) waitReady(ctx context.Context, p *child.Process, url, token string, ok func(body string) bool) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.pki.caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(ctx, s.readyTimeout)
	defer cancel()
	last := "no answer yet"
	for {
		if p.Exited() {
			err := fmt.Errorf("exited before becoming ready (%v); log tail:\n%s", p.Err(), p.LogTail(40))
			if logMentionsPortInUse(p) {
				return fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("building readiness request: %w", err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if resp, err := client.Do(req); err != nil {
			last = err.Error()
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && (ok == nil || ok(string(body))) {
				return nil
			}
			last = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, lastLines(string(body), 15))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready after %v (%v); last check: %s; log tail:\n%s",
				s.readyTimeout, context.Cause(ctx), last, p.LogTail(40))
		case <-p.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// URL is the API server's https address, e.g. https://127.0.0.1:41234.
func (s *Server) URL() string { return s.url }

// EtcdURL is etcd's client address.
func (s *Server) EtcdURL() string { return s.etcdURL }

// Dir is the directory holding the data, logs, keys and kubeconfigs of this
// instance (removed when the test ends).
func (s *Server) Dir() string { return s.dir }

// LogPath returns the log file of "etcd" or "kube-apiserver".
func (s *Server) LogPath(name string) string { return filepath.Join(s.dir, "logs", name+".log") }

// CAData is the PEM CA bundle that verifies the API server's certificate.
func (s *Server) CAData() []byte { return append([]byte(nil), s.pki.caPEM...) }

// AdminConfig returns a new client config for the admin user.
func (s *Server) AdminConfig() *rest.Config { return s.tokenConfig(s.adminToken) }

// Client returns a clientset authenticated as the admin user.
func (s *Server) Client() kubernetes.Interface { return s.client }

// AdminKubeconfig is the path of a kubeconfig file for the admin user.
func (s *Server) AdminKubeconfig() string { return s.adminKubeconfig }

func (s *Server) tokenConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            s.url,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CAData()},
		QPS:             100,
		Burst:           200,
		UserAgent:       "xdplb-tests",
	}
}
