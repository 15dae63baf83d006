package manifests_test

import (
	"fmt"
	"maps"
	"math/big"
	"net"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/xdplb/xdplb/tests/apiserver"
)

const (
	namespace  = "kube-system"
	image      = "ghcr.io/xdplb/xdplb"
	healthPort = 10256
)

// deploy is deploy/ parsed: raw objects in kustomization order, and each one
// decoded strictly into its Go type.
type deploy struct {
	k         *apiserver.Kustomization
	manifests []apiserver.Manifest

	sa      *corev1.ServiceAccount
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	config  *corev1.ConfigMap
	ds      *appsv1.DaemonSet
}

func load(t *testing.T) *deploy {
	t.Helper()
	dir, err := apiserver.DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	k, err := apiserver.ReadKustomization(dir)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := k.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	d := &deploy{k: k, manifests: ms}
	seen := map[string]string{}
	for _, m := range ms {
		obj, err := decodeStrict(m.Object)
		if err != nil {
			t.Fatalf("%s: %v", m.Source, err)
		}
		id := m.Object.GetKind() + "/" + m.Object.GetName()
		if prev, dup := seen[id]; dup {
			t.Fatalf("%s: %s already defined in %s", m.Source, id, prev)
		}
		seen[id] = m.Source
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			d.sa = o
		case *rbacv1.ClusterRole:
			d.role = o
		case *rbacv1.ClusterRoleBinding:
			d.binding = o
		case *corev1.ConfigMap:
			d.config = o
		case *appsv1.DaemonSet:
			d.ds = o
		default:
			t.Errorf("%s: unexpected %s in deploy/", m.Source, id)
		}
	}
	if d.sa == nil || d.role == nil || d.binding == nil || d.config == nil || d.ds == nil {
		t.Fatalf("deploy/ must hold a ServiceAccount, ClusterRole, ClusterRoleBinding, ConfigMap and DaemonSet; has %v",
			slices.Sorted(maps.Keys(seen)))
	}
	return d
}

// decodeStrict converts u into its typed object, rejecting unknown fields.
func decodeStrict(u *unstructured.Unstructured) (runtime.Object, error) {
	gvk := u.GroupVersionKind()
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("unknown kind %s: %w", gvk, err)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, obj, true); err != nil {
		return nil, fmt.Errorf("decoding %s %s: %w", gvk.Kind, u.GetName(), err)
	}
	return obj, nil
}

func TestObjectsAndNamespaces(t *testing.T) {
	d := load(t)
	if d.k.Namespace != namespace {
		t.Errorf("kustomization namespace = %q, want %q", d.k.Namespace, namespace)
	}
	for _, m := range d.manifests {
		clusterScoped := m.Object.GetKind() == "ClusterRole" || m.Object.GetKind() == "ClusterRoleBinding"
		switch ns := m.Object.GetNamespace(); {
		case clusterScoped && ns != "":
			t.Errorf("%s: cluster-scoped %s has namespace %q", m.Source, m.Object.GetKind(), ns)
		case !clusterScoped && ns != namespace:
			t.Errorf("%s: %s %s in namespace %q, want %q", m.Source, m.Object.GetKind(), m.Object.GetName(), ns, namespace)
		}
		if got := m.Object.GetLabels()["k8s-app"]; got != "xdplb" {
			t.Errorf("%s: label k8s-app = %q, want xdplb", m.Source, got)
		}
	}
	if d.sa.Name != "xdplb" || d.role.Name != "xdplb" || d.binding.Name != "xdplb" ||
		d.config.Name != "xdplb-config" || d.ds.Name != "xdplb" {
		t.Errorf("object names: ServiceAccount %q ClusterRole %q ClusterRoleBinding %q ConfigMap %q DaemonSet %q",
			d.sa.Name, d.role.Name, d.binding.Name, d.config.Name, d.ds.Name)
	}
}

func TestClusterRoleIsLeastPrivilege(t *testing.T) {
	d := load(t)
	want := []string{
		"get /nodes", "list /nodes", "watch /nodes",
		"list /services", "watch /services",
		"list discovery.k8s.io/endpointslices", "watch discovery.k8s.io/endpointslices",
	}
	var got []string
	for i, r := range d.role.Rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %d: unexpected resourceNames/nonResourceURLs: %+v", i, r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if g == "*" || res == "*" || v == "*" {
						t.Errorf("rule %d: wildcard in %+v", i, r)
					}
					got = append(got, v+" "+g+"/"+res)
				}
			}
		}
	}
	if d.role.AggregationRule != nil {
		t.Errorf("ClusterRole must not aggregate other roles")
	}
	slices.Sort(got)
	got = slices.Compact(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("ClusterRole grants\n  %s\nwant exactly\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	b := d.binding
	if b.RoleRef.APIGroup != rbacv1.GroupName || b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != d.role.Name {
		t.Errorf("ClusterRoleBinding roleRef = %+v, want ClusterRole %s", b.RoleRef, d.role.Name)
	}
	wantSubject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: d.sa.Name, Namespace: d.sa.Namespace}}
	if !reflect.DeepEqual(b.Subjects, wantSubject) {
		t.Errorf("ClusterRoleBinding subjects = %+v, want %+v", b.Subjects, wantSubject)
	}
}

func TestConfigMap(t *testing.T) {
	d := load(t)
	envName := regexp.MustCompile(`^XDPLB_[A-Z0-9]+(_[A-Z0-9]+)*$`)
	for k := range d.config.Data {
		// The API server's own address, which docs/deploying.md's cut-over
		// from kube-proxy has set here.
		apiServer := k == "KUBERNETES_SERVICE_HOST" || k == "KUBERNETES_SERVICE_PORT"
		if !envName.MatchString(k) && !apiServer {
			t.Errorf("ConfigMap key %q is not an XDPLB_<FLAG_NAME> variable", k)
		}
	}
	if len(d.config.BinaryData) > 0 {
		t.Errorf("ConfigMap has binaryData; flags are text")
	}
	for k, want := range map[string]string{"XDPLB_IFACE": "eth0", "XDPLB_XDP_MODE": "best-effort"} {
		if got := d.config.Data[k]; got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if m, err := strconv.ParseInt(d.config.Data["XDPLB_MAGLEV_TABLE_SIZE"], 10, 64); err != nil || !big.NewInt(m).ProbablyPrime(20) {
		t.Errorf("XDPLB_MAGLEV_TABLE_SIZE = %q, want a prime", d.config.Data["XDPLB_MAGLEV_TABLE_SIZE"])
	}
	if n, err := strconv.ParseUint(d.config.Data["XDPLB_CONNTRACK_MAX"], 10, 32); err != nil || n == 0 {
		t.Errorf("XDPLB_CONNTRACK_MAX = %q, want a positive 32-bit count", d.config.Data["XDPLB_CONNTRACK_MAX"])
	}
	if addr, ok := d.config.Data["XDPLB_HEALTHZ_BIND_ADDRESS"]; ok {
		if _, port, err := net.SplitHostPort(addr); err != nil || port != strconv.Itoa(healthPort) {
			t.Errorf("XDPLB_HEALTHZ_BIND_ADDRESS = %q, want port %d (the probes' port)", addr, healthPort)
		}
	}
}

func TestDaemonSet(t *testing.T) {
	d := load(t)
	ds := d.ds
	spec := ds.Spec.Template.Spec

	if ds.Namespace != namespace || ds.Labels["k8s-app"] != "xdplb" {
		t.Errorf("DaemonSet %s/%s labels %v", ds.Namespace, ds.Name, ds.Labels)
	}
	wantSelector := &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "xdplb"}}
	if !reflect.DeepEqual(ds.Spec.Selector, wantSelector) {
		t.Errorf("selector = %+v, want %+v", ds.Spec.Selector, wantSelector)
	}
	if ds.Spec.Template.Labels["k8s-app"] != "xdplb" {
		t.Errorf("pod template labels = %v, want k8s-app=xdplb", ds.Spec.Template.Labels)
	}
	us := ds.Spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable == nil || *us.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
		t.Errorf("updateStrategy = %+v, want RollingUpdate with maxUnavailable 1", us)
	}

	if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork %v dnsPolicy %q, want true and ClusterFirstWithHostNet", spec.HostNetwork, spec.DNSPolicy)
	}
	if spec.HostPID || spec.HostIPC {
		t.Errorf("hostPID/hostIPC must stay off")
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName = %q", spec.PriorityClassName)
	}
	if spec.ServiceAccountName != d.sa.Name {
		t.Errorf("serviceAccountName = %q, want %q", spec.ServiceAccountName, d.sa.Name)
	}
	if v, ok := spec.NodeSelector["node-role.kubernetes.io/edge"]; !ok || v != "" {
		t.Errorf("nodeSelector = %v, want node-role.kubernetes.io/edge: \"\"", spec.NodeSelector)
	}
	for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
		if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
			return tol.Key == "" && tol.Operator == corev1.TolerationOpExists && tol.Effect == effect
		}) {
			t.Errorf("no toleration {operator: Exists, effect: %s}", effect)
		}
	}
	// A start that resizes a large conntrack took about 40 s; SIGTERM
	// lets it finish rather than kill it between two datapaths.
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 60 {
		t.Errorf("terminationGracePeriodSeconds %v, want at least 60 s: a start that resizes the conntrack must finish", g)
	}
	if len(spec.InitContainers) != 0 || len(spec.Containers) != 1 {
		t.Fatalf("want exactly one container and no init containers, have %d and %d",
			len(spec.Containers), len(spec.InitContainers))
	}

	c := spec.Containers[0]
	if repo, _, _ := strings.Cut(c.Image, ":"); repo != image {
		t.Errorf("image = %q, want %s:<tag>", c.Image, image)
	}
	if !slices.ContainsFunc(d.k.Images, func(i apiserver.KustomizeImage) bool { return i.Name == image }) {
		t.Errorf("kustomization images has no entry for %s, so it cannot be overridden", image)
	}
	if !slices.Equal(c.Args, []string{"agent"}) || len(c.Command) != 0 {
		t.Errorf("command %q args %q, want the image entrypoint with [agent]", c.Command, c.Args)
	}
	if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.ConfigMapRef != nil && e.ConfigMapRef.Name == d.config.Name && e.Prefix == ""
	}) {
		t.Errorf("envFrom = %+v, want configMapRef %s without prefix", c.EnvFrom, d.config.Name)
	}
	nodeName := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NODE_NAME" })
	if nodeName < 0 || c.Env[nodeName].ValueFrom == nil || c.Env[nodeName].ValueFrom.FieldRef == nil ||
		c.Env[nodeName].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("env = %+v, want NODE_NAME from fieldRef spec.nodeName", c.Env)
	}
	// The agent checks the map sizes against its container's limit.
	limit := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "XDPLB_MEMORY_LIMIT" })
	if limit < 0 || c.Env[limit].ValueFrom == nil || c.Env[limit].ValueFrom.ResourceFieldRef == nil ||
		c.Env[limit].ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		t.Errorf("env = %+v, want XDPLB_MEMORY_LIMIT from resourceFieldRef limits.memory", c.Env)
	}

	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("container securityContext with capabilities is required")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container must not be privileged")
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		// The API server rejects this together with SYS_ADMIN.
		t.Errorf("allowPrivilegeEscalation: false conflicts with SYS_ADMIN")
	}
	gotAdd := make([]string, 0, len(sc.Capabilities.Add))
	for _, c := range sc.Capabilities.Add {
		gotAdd = append(gotAdd, string(c))
	}
	slices.Sort(gotAdd)
	if want := []string{"BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"}; !slices.Equal(gotAdd, want) {
		t.Errorf("capabilities.add = %v, want exactly %v", gotAdd, want)
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities.drop = %v, want [ALL]", sc.Capabilities.Drop)
	}

	checkProbe(t, "liveness", c.LivenessProbe, "/livez", c)
	checkProbe(t, "readiness", c.ReadinessProbe, "/healthz", c)
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool {
		return p.ContainerPort == healthPort && (p.Protocol == "" || p.Protocol == corev1.ProtocolTCP)
	}) {
		t.Errorf("ports = %+v, want containerPort %d/TCP", c.Ports, healthPort)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[r]; !ok || q.IsZero() {
			t.Errorf("resources.requests.%s must be set", r)
		}
	}

	checkHostMount(t, spec, c, "/sys/fs/bpf", "/sys/fs/bpf", corev1.HostPathDirectoryOrCreate, false)
	checkHostMount(t, spec, c, "/sys", "/sys", "", true)
	// Writable: the SNAT port range is reserved through it.
	checkHostMount(t, spec, c, "/proc/sys/net", "/host/proc/sys/net", corev1.HostPathDirectory, false)
	if got := d.config.Data["XDPLB_HOST_PROC_SYS"]; got != "/host/proc/sys" {
		t.Errorf("XDPLB_HOST_PROC_SYS = %q, want /host/proc/sys, where the node's /proc/sys/net is mounted", got)
	}
	for _, m := range c.VolumeMounts {
		if m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
			t.Errorf("mount %s: Bidirectional propagation needs a privileged container", m.MountPath)
		}
		if m.MountPath == "/sys/fs/bpf" && (m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationHostToContainer) {
			t.Errorf("mount /sys/fs/bpf: want HostToContainer propagation so a node bpffs mounted later is seen")
		}
	}
}

func checkProbe(t *testing.T, kind string, p *corev1.Probe, path string, c corev1.Container) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s probe: want httpGet %s on %d", kind, path, healthPort)
		return
	}
	port := p.HTTPGet.Port
	if port.Type == intstr.String {
		i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == port.StrVal })
		if i < 0 {
			t.Errorf("%s probe: named port %q not declared", kind, port.StrVal)
			return
		}
		port = intstr.FromInt32(c.Ports[i].ContainerPort)
	}
	if p.HTTPGet.Path != path || port.IntValue() != healthPort ||
		(p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP) {
		t.Errorf("%s probe = %+v, want HTTP GET %s on %d", kind, p.HTTPGet, path, healthPort)
	}
}

func checkHostMount(t *testing.T, spec corev1.PodSpec, c corev1.Container, hostPath, mountPath string, typ corev1.HostPathType, readOnly bool) {
	t.Helper()
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == hostPath })
	if i < 0 {
		t.Errorf("no hostPath volume for %s", hostPath)
		return
	}
	v := spec.Volumes[i]
	if typ != "" && (v.HostPath.Type == nil || *v.HostPath.Type != typ) {
		t.Errorf("hostPath %s type = %v, want %s", hostPath, v.HostPath.Type, typ)
	}
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name })
	if j < 0 {
		t.Errorf("volume %s (%s) is not mounted", v.Name, hostPath)
		return
	}
	if m := c.VolumeMounts[j]; m.MountPath != mountPath || m.ReadOnly != readOnly {
		t.Errorf("mount of %s = %s (readOnly %v), want %s (readOnly %v)", hostPath, m.MountPath, m.ReadOnly, mountPath, readOnly)
	}
}

// TestServerSideDryRun has a real API server validate and admit every
// manifest without persisting anything, and checks that it would catch a
// broken one.
func TestServerSideDryRun(t *testing.T) {
	d := load(t)
	s := apiserver.Start(t)
	ctx := t.Context()

	objs := make([]*unstructured.Unstructured, 0, len(d.manifests))
	for _, m := range d.manifests {
		objs = append(objs, m.Object)
	}
	if err := s.DryRunApply(ctx, objs...); err != nil {
		t.Fatalf("server-side dry run of deploy/: %v", err)
	}
	if _, err := s.Client().AppsV1().DaemonSets(namespace).Get(ctx, d.ds.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("dry run persisted the DaemonSet (get: %v)", err)
	}

	dsObj := func() *unstructured.Unstructured {
		i := slices.IndexFunc(d.manifests, func(m apiserver.Manifest) bool { return m.Object.GetKind() == "DaemonSet" })
		return d.manifests[i].Object.DeepCopy()
	}

	t.Run("UnknownFieldRejected", func(t *testing.T) {
		bad := dsObj()
		if err := unstructured.SetNestedField(bad.Object, true, "spec", "template", "spec", "hostNetwrok"); err != nil {
			t.Fatal(err)
		}
		if err := s.DryRunApply(ctx, bad); err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
			t.Errorf("misspelt field: got %v, want a strict validation error naming it", err)
		}
	})

	t.Run("BidirectionalNeedsPrivileged", func(t *testing.T) {
		typed := d.ds.DeepCopy()
		bidi := corev1.MountPropagationBidirectional
		c := &typed.Spec.Template.Spec.Containers[0]
		for i := range c.VolumeMounts {
			if c.VolumeMounts[i].MountPath == "/sys/fs/bpf" {
				c.VolumeMounts[i].MountPropagation = &bidi
			}
		}
		raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(typed)
		if err != nil {
			t.Fatal(err)
		}
		bad := &unstructured.Unstructured{Object: raw}
		bad.SetGroupVersionKind(appsv1.SchemeGroupVersion.WithKind("DaemonSet"))
		err = s.DryRunApply(ctx, bad)
		if err == nil || !strings.Contains(err.Error(), "Bidirectional") {
			t.Errorf("Bidirectional propagation in an unprivileged container: got %v, want it rejected", err)
		}
	})
}
