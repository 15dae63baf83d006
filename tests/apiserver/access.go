package apiserver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Access is a set of credentials for one identity on a [Server].
type Access struct {
	// Config authenticates as the identity; callers may modify it.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file holding the same credentials, for
	// processes such as the agent.
	Kubeconfig string
}

// Client returns a clientset for the identity.
func (a Access) Client() (kubernetes.Interface, error) {
	c, err := kubernetes.NewForConfig(a.Config)
	if err != nil {
		return nil, fmt.Errorf("creating clientset: %w", err)
	}
	return c, nil
}

// Can asks the authorizer (through a SelfSubjectAccessReview) whether the
// identity may perform verb on resource of API group (empty for core) in
// namespace (empty for all namespaces or cluster scope).
func (a Access) Can(ctx context.Context, verb, group, resource, namespace string) (bool, error) {
	c, err := a.Client()
	if err != nil {
		return false, err
	}
	review, err := c.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: verb, Group: group, Resource: resource, Namespace: namespace,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing %s %s.%s: %w", verb, resource, group, err)
	}
	return review.Status.Allowed, nil
}

// WaitCan polls [Access.Can] until it is allowed or ctx ends. RBAC changes
// reach the authorizer through a watch, a moment after they are written.
func (a Access) WaitCan(ctx context.Context, verb, group, resource, namespace string) error {
	for {
		ok, err := a.Can(ctx, verb, group, resource, namespace)
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still not allowed to %s %s.%s (last error %v): %w",
				verb, resource, group, err, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// User returns the credentials of a static token user declared with
// [WithUser].
func (s *Server) User(t testing.TB, name string) Access {
	t.Helper()
	tok, ok := s.userTokens[name]
	if !ok {
		t.Fatalf("token user %q was not declared with apiserver.WithUser", name)
	}
	return s.access(t, "user-"+name, tok)
}

// ServiceAccount creates namespace/name if it does not exist and returns
// credentials from a bound token (TokenRequest API) valid for 24 hours, so
// the identity is the one a pod running as that ServiceAccount would have.
func (s *Server) ServiceAccount(t testing.TB, namespace, name string) Access {
	t.Helper()
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	_, err := s.client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating ServiceAccount %s/%s: %v", namespace, name, err)
	}
	expiry := int64((24 * time.Hour).Seconds())
	tr, err := s.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token for ServiceAccount %s/%s: %v", namespace, name, err)
	}
	return s.access(t, "sa-"+namespace+"-"+name, tr.Status.Token)
}

// AgentAccess applies the ServiceAccount, ClusterRole and ClusterRoleBinding
// from deploy/ (exactly as written there), waits until the authorizer grants
// the ServiceAccount every rule of that ClusterRole, and returns its
// credentials: the identity the agent has in a cluster.
func (s *Server) AgentAccess(t testing.TB) Access {
	t.Helper()
	ctx := t.Context()
	dir, err := DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ReadKustomization(dir)
	if err != nil {
		t.Fatal(err)
	}
	manifests, err := k.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	var objs []*unstructured.Unstructured
	var sa *unstructured.Unstructured
	var role rbacv1.ClusterRole
	for _, m := range manifests {
		switch m.Object.GetKind() {
		case "ServiceAccount":
			if sa != nil {
				t.Fatalf("deploy/ has more than one ServiceAccount")
			}
			sa = m.Object
		case "ClusterRole":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m.Object.Object, &role); err != nil {
				t.Fatalf("decoding ClusterRole from %s: %v", m.Source, err)
			}
		case "ClusterRoleBinding":
		default:
			continue
		}
		objs = append(objs, m.Object)
	}
	if sa == nil || role.Name == "" {
		t.Fatalf("deploy/ lacks a ServiceAccount or a ClusterRole")
	}
	if err := s.Apply(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	a := s.ServiceAccount(t, sa.GetNamespace(), sa.GetName())
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, rule := range role.Rules {
		for _, group := range rule.APIGroups {
			for _, resource := range rule.Resources {
				for _, verb := range rule.Verbs {
					if err := a.WaitCan(waitCtx, verb, group, resource, ""); err != nil {
						t.Fatalf("ServiceAccount %s/%s: %v", sa.GetNamespace(), sa.GetName(), err)
					}
				}
			}
		}
	}
	return a
}

// BindClusterRole creates ClusterRoleBinding name granting clusterRole to
// subjects, e.g. rbacv1.Subject{Kind: rbacv1.UserKind, Name: "alice"}. The
// authorizer sees it a moment later: wait with [Access.WaitCan].
func (s *Server) BindClusterRole(t testing.TB, name, clusterRole string, subjects ...rbacv1.Subject) {
	t.Helper()
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   subjects,
	}
	if _, err := s.client.RbacV1().ClusterRoleBindings().Create(t.Context(), b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRoleBinding %s: %v", name, err)
	}
}

// WriteKubeconfig writes cfg (host, CA and bearer token) as a kubeconfig file
// named after name in the server's directory and returns its path.
func (s *Server) WriteKubeconfig(t testing.TB, name string, cfg *rest.Config) string {
	t.Helper()
	path, err := s.writeKubeconfig(name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func (s *Server) access(t testing.TB, name, token string) Access {
	t.Helper()
	cfg := s.tokenConfig(token)
	return Access{Config: cfg, Kubeconfig: s.WriteKubeconfig(t, name, cfg)}
}

// fileName maps name to a safe file name.
func fileName(name string) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == '-' || r == '_' || ('0' <= r && r <= '9') || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') {
			return r
		}
		return '_'
	}, name)
}

func (s *Server) writeKubeconfig(name string, cfg *rest.Config) (string, error) {
	const cluster = "xdplb-test"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[cluster] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: cluster, AuthInfo: name}
	kc.CurrentContext = name
	path := filepath.Join(s.dir, "kubeconfigs", fileName(name)+".yaml")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("writing kubeconfig %s: %w", name, err)
	}
	return path, nil
}
