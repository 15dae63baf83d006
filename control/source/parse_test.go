package source

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// waitTimeout bounds every wait for something to happen.
const waitTimeout = 3 * time.Second

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// names lists objects as "namespace/name".
func names[T interface {
	GetNamespace() string
	GetName() string
}](objs []T) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetNamespace()+"/"+o.GetName())
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

const svcWeb = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: 10.96.0.10
  ports:
  - port: 80
    targetPort: 8080
`

const sliceWeb = `apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true}
ports:
- port: 8080
`

func TestParseObjectsValid(t *testing.T) {
	list, err := os.ReadFile("testdata/list.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		data      string
		svcs, eps []string
	}{
		{name: "empty file"},
		{name: "comments and separators only", data: "# nothing here\n---\n---\n# still nothing\n...\n"},
		{name: "one document", data: svcWeb, svcs: []string{"default/web"}},
		{
			name: "multi-document stream with empty documents",
			data: "# services\n---\n" + svcWeb + "---\n---\n" + sliceWeb + "---\n",
			svcs: []string{"default/web"},
			eps:  []string{"default/web-1"},
		},
		{
			name: "separator followed by a comment",
			data: "--- # first\n" + svcWeb + "--- # second\n" + sliceWeb,
			svcs: []string{"default/web"},
			eps:  []string{"default/web-1"},
		},
		{
			name: "CRLF line endings and BOM",
			data: "\ufeff" + strings.ReplaceAll(svcWeb+"---\n"+sliceWeb, "\n", "\r\n"),
			svcs: []string{"default/web"},
			eps:  []string{"default/web-1"},
		},
		{
			name: "kubectl List",
			data: string(list),
			svcs: []string{"shop/web", "shop/db"},
			eps:  []string{"shop/web-x7k2p"},
		},
		{
			name: "List and documents mixed",
			data: string(list) + "---\n" + svcWeb + "---\n" + sliceWeb,
			svcs: []string{"shop/web", "shop/db", "default/web"},
			eps:  []string{"shop/web-x7k2p", "default/web-1"},
		},
		{
			name: "empty List",
			data: "apiVersion: v1\nkind: List\nitems: []\n",
		},
		{
			name: "same name in other namespaces and kinds",
			data: svcWeb + "---\n" + strings.Replace(svcWeb, "name: web", "name: web\n  namespace: other", 1) +
				"---\n" + strings.Replace(sliceWeb, "name: web-1", "name: web", 1),
			svcs: []string{"default/web", "other/web"},
			eps:  []string{"default/web"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs, eps, err := ParseObjects("services.yaml", []byte(tt.data))
			if err != nil {
				t.Fatalf("ParseObjects: %v", err)
			}
			if got := names(svcs); !equalStrings(got, tt.svcs) {
				t.Errorf("services = %q, want %q", got, tt.svcs)
			}
			if got := names(eps); !equalStrings(got, tt.eps) {
				t.Errorf("slices = %q, want %q", got, tt.eps)
			}
		})
	}
}

// TestParseObjectsContent checks that objects are decoded completely, as
// kubectl prints them.
func TestParseObjectsContent(t *testing.T) {
	data, err := os.ReadFile("testdata/list.yaml")
	if err != nil {
		t.Fatal(err)
	}
	svcs, eps, err := ParseObjects("list.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	web := svcs[0]
	if web.Kind != "Service" || web.APIVersion != "v1" {
		t.Errorf("type meta = %v", web.TypeMeta)
	}
	if web.Spec.Type != corev1.ServiceTypeLoadBalancer || web.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal ||
		web.Spec.HealthCheckNodePort != 31234 || len(web.Spec.ClusterIPs) != 1 || web.Spec.ClusterIPs[0] != "10.96.12.34" {
		t.Errorf("spec = %+v", web.Spec)
	}
	if p := web.Spec.Ports[0]; p.Port != 80 || p.NodePort != 30080 || p.TargetPort != intstr.FromString("http") || p.Protocol != corev1.ProtocolTCP {
		t.Errorf("port = %+v", p)
	}
	if ing := web.Status.LoadBalancer.Ingress; len(ing) != 1 || ing[0].IP != "192.0.2.10" || ing[0].IPMode == nil || *ing[0].IPMode != corev1.LoadBalancerIPModeVIP {
		t.Errorf("ingress = %+v", ing)
	}
	if web.CreationTimestamp.IsZero() || web.ResourceVersion != "4711" {
		t.Errorf("metadata = %+v", web.ObjectMeta)
	}
	s := eps[0]
	if s.AddressType != discoveryv1.AddressTypeIPv4 || s.Labels[discoveryv1.LabelServiceName] != "web" {
		t.Errorf("slice = %+v", s)
	}
	e := s.Endpoints[0]
	if e.Addresses[0] != "10.244.1.5" || e.NodeName == nil || *e.NodeName != "edge-1" || e.Zone == nil || *e.Zone != "zone-a" ||
		e.Conditions.Ready == nil || !*e.Conditions.Ready || e.Conditions.Terminating == nil || *e.Conditions.Terminating {
		t.Errorf("endpoint = %+v", e)
	}
	if p := s.Ports[0]; p.Name == nil || *p.Name != "http" || p.Port == nil || *p.Port != 8080 {
		t.Errorf("slice port = %+v", p)
	}
}

func TestParseObjectsErrors(t *testing.T) {
	tests := []struct {
		name string
		data string
		want []string // the lines of the error
	}{
		{
			name: "unknown field",
			data: "---\n" + svcWeb + "---\n" + strings.Replace(strings.Replace(svcWeb, "  clusterIP:", "  portz: 1\n  clusterIP:", 1), "name: web", "name: api", 1),
			want: []string{`services.yaml:17: document 2 (Service default/api): unknown field "spec.portz"`},
		},
		{
			name: "unknown fields in list elements, in file order",
			data: strings.Replace(sliceWeb, "  conditions:", "  bogus: 1\n  conditions:", 1) +
				"  extra: true\nspec: {}\n",
			want: []string{
				`services.yaml:10: document 1 (EndpointSlice default/web-1): unknown field "endpoints[0].bogus"`,
				`services.yaml:14: document 1 (EndpointSlice default/web-1): unknown field "ports[0].extra"`,
				`services.yaml:15: document 1 (EndpointSlice default/web-1): unknown field "spec"`,
			},
		},
		{
			name: "field names are case sensitive",
			data: strings.Replace(svcWeb, "spec:", "Spec:", 1),
			want: []string{`services.yaml:5: document 1 (Service default/web): unknown field "Spec"`},
		},
		{
			name: "wrong scalar type",
			data: strings.Replace(svcWeb, "port: 80", `port: "80"`, 1),
			want: []string{`services.yaml:8: document 1 (Service default/web): field "spec.ports.port": want int32, got a string`},
		},
		{
			name: "number out of range",
			data: strings.Replace(svcWeb, "port: 80", `port: 99999999999`, 1),
			want: []string{`services.yaml:8: document 1 (Service default/web): field "spec.ports.port": want int32, got number 99999999999`},
		},
		{
			name: "wrong structure",
			data: "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: [1]\n",
			want: []string{`services.yaml:4: document 1 (Service default/web): field "spec": want an object, got a list`},
		},
		{
			name: "label values must be strings",
			data: strings.Replace(sliceWeb, "kubernetes.io/service-name: web", "kubernetes.io/service-name: 1", 1),
			want: []string{`services.yaml:5: document 1 (EndpointSlice default/web-1): field "metadata.labels": want a string, got a number`},
		},
		{
			name: "missing kind",
			data: "apiVersion: v1\nmetadata:\n  name: web\n",
			want: []string{`services.yaml:1: document 1 (web): kind is required`},
		},
		{
			name: "missing apiVersion",
			data: "# comment\n\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n",
			want: []string{`services.yaml:3: document 1 (Service shop/web): apiVersion is required`},
		},
		{
			name: "missing name",
			data: "apiVersion: v1\nkind: Service\nmetadata:\n  namespace: shop\nspec: {}\n",
			want: []string{`services.yaml:1: document 1 (Service): metadata.name is required`},
		},
		{
			name: "missing metadata",
			data: "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n",
			want: []string{`services.yaml:1: document 1 (EndpointSlice): metadata.name is required`},
		},
		{
			name: "other kind",
			data: svcWeb + "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: kube-system}\n",
			want: []string{`services.yaml:11: document 2 (ConfigMap kube-system/cfg): unsupported kind "ConfigMap": want Service, EndpointSlice or List`},
		},
		{
			name: "old apiVersion",
			data: strings.Replace(sliceWeb, "discovery.k8s.io/v1", "discovery.k8s.io/v1beta1", 1),
			want: []string{`services.yaml:1: document 1 (EndpointSlice default/web-1): unsupported apiVersion "discovery.k8s.io/v1beta1" for kind EndpointSlice: want discovery.k8s.io/v1`},
		},
		{
			name: "duplicate documents",
			data: svcWeb + "---\n" + strings.Replace(svcWeb, "name: web", "name: web\n  namespace: default", 1),
			want: []string{`services.yaml:11: document 2 (Service default/web): duplicate object, first defined in document 1 at line 1`},
		},
		{
			name: "duplicate in a List",
			data: "apiVersion: v1\nkind: List\nitems:\n" + indent(svcWeb) + indent(svcWeb),
			want: []string{`services.yaml:13: document 1, items[1] (Service default/web): duplicate object, first defined in document 1, items[0] at line 4`},
		},
		{
			name: "invalid YAML",
			data: svcWeb + "---\napiVersion: v1\nkind: Service\nmetadata: [\n",
			want: []string{`services.yaml:13: document 2: invalid YAML: did not find expected node content`},
		},
		{
			name: "duplicate YAML key",
			data: svcWeb + "---\n" + strings.Replace(svcWeb, "  name: web\n", "  name: web\n  name: api\n", 1),
			want: []string{`services.yaml:15: document 2: invalid YAML: key "name" already set in map`},
		},
		{
			name: "document is not an object",
			data: "- apiVersion: v1\n  kind: Service\n",
			want: []string{`services.yaml:1: document 1: want an object with kind, apiVersion and metadata, got a list`},
		},
		{
			name: "List with an unknown field",
			data: "apiVersion: v1\nkind: List\nmetadata: {}\nitemz: []\n",
			want: []string{`services.yaml:4: document 1 (List): unknown field "itemz"`},
		},
		{
			name: "List with a wrong apiVersion",
			data: "apiVersion: v2\nkind: List\nitems: []\n",
			want: []string{`services.yaml:1: document 1 (List): unsupported apiVersion "v2" for kind List: want v1`},
		},
		{
			name: "problems in List items",
			data: "apiVersion: v1\nkind: List\nitems:\n" + indent(svcWeb) +
				indent(strings.Replace(sliceWeb, "addressType", "adressType", 1)) +
				"- 42\n" +
				"- apiVersion: v1\n  kind: List\n  items: []\n" +
				"- null\n",
			want: []string{
				`services.yaml:19: document 1, items[1] (EndpointSlice default/web-1): unknown field "adressType"`,
				`services.yaml:25: document 1, items[2]: want an object with kind, apiVersion and metadata, got a number`,
				`services.yaml:26: document 1, items[3] (List): a List inside a List is not supported`,
				`services.yaml:29: document 1, items[4]: want an object with kind, apiVersion and metadata, got null`,
			},
		},
		{
			name: "several problems in one object",
			data: "kind: Service\nmetadata: {}\nspec:\n  foo: 1\n",
			want: []string{
				`services.yaml:1: document 1 (Service): apiVersion is required`,
				`services.yaml:1: document 1 (Service): metadata.name is required`,
				`services.yaml:4: document 1 (Service): unknown field "spec.foo"`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svcs, eps, err := ParseObjects("services.yaml", []byte(tt.data))
			if err == nil {
				t.Fatal("ParseObjects succeeded")
			}
			if svcs != nil || eps != nil {
				t.Errorf("objects returned with an error: %d services, %d slices", len(svcs), len(eps))
			}
			if got, want := err.Error(), strings.Join(tt.want, "\n"); got != want {
				t.Errorf("error:\n%s\nwant:\n%s", got, want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != "services.yaml" {
				t.Errorf("error %#v is not a *ParseError", err)
			}
		})
	}
}

// indent turns a document into a List item.
func indent(doc string) string {
	lines := strings.Split(strings.TrimSuffix(doc, "\n"), "\n")
	for i, l := range lines {
		if i == 0 {
			lines[i] = "- " + l
		} else {
			lines[i] = "  " + l
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestParseObjectsCapsProblems(t *testing.T) {
	var b strings.Builder
	for i := range maxProblems + 5 {
		fmt.Fprintf(&b, "---\nkind: Service\napiVersion: v1\nmetadata: {name: s%d}\nbogus: 1\n", i)
	}
	_, _, err := ParseObjects("big.yaml", []byte(b.String()))
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxProblems+1 {
		t.Fatalf("%d lines, want %d", len(lines), maxProblems+1)
	}
	if want := "big.yaml: 5 more problems not shown"; lines[maxProblems] != want {
		t.Errorf("last line %q, want %q", lines[maxProblems], want)
	}
}

func TestParseErrorFormat(t *testing.T) {
	e := &ParseError{File: "f.yaml", Document: 2, Item: -1, Err: errors.New("boom")}
	if got, want := e.Error(), "f.yaml: document 2: boom"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(fmt.Errorf("wrapped: %w", e), e.Err) {
		t.Error("Unwrap does not reach the problem")
	}
}

func TestSplitDocuments(t *testing.T) {
	tests := []struct {
		data  string
		lines []int // first line of each document
	}{
		{"", nil},
		{"a: 1\n", []int{1}},
		{"# c\n---\na: 1\n", []int{2}},
		{"a: 1\n---\nb: 2\n", []int{1, 2}},
		{"---\n---\na: 1\n---", []int{1, 2, 4}},
		{"a: 1\n---x: 2\n", []int{1}}, // not a separator
		{"a: |\n  ---\n", []int{1}},   // indented: not a separator
	}
	for _, tt := range tests {
		var got []int
		for i, d := range splitDocuments([]byte(tt.data)) {
			if d.number != i+1 {
				t.Errorf("%q: document %d numbered %d", tt.data, i+1, d.number)
			}
			got = append(got, d.line)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.lines) {
			t.Errorf("%q: document lines %v, want %v", tt.data, got, tt.lines)
		}
	}
}

// FuzzParseObjects checks that no input makes the parser panic, and that
// every problem names the file and a line.
func FuzzParseObjects(f *testing.F) {
	list, err := os.ReadFile("testdata/list.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(list)
	f.Add([]byte(svcWeb + "---\n" + sliceWeb))
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- *a\n"))
	f.Add([]byte("kind: Service\napiVersion: v1\nmetadata: &m {name: a}\nspec: {ports: [{port: x}], <<: *m}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		svcs, eps, err := ParseObjects("f.yaml", data)
		if err != nil {
			if svcs != nil || eps != nil {
				t.Fatal("objects with an error")
			}
			for line := range strings.Lines(err.Error()) {
				if !strings.HasPrefix(line, "f.yaml") {
					t.Fatalf("problem %q does not name the file", line)
				}
			}
			return
		}
		for _, s := range svcs {
			if s.Name == "" || s.Namespace == "" {
				t.Fatalf("service without identity: %+v", s.ObjectMeta)
			}
		}
		for _, s := range eps {
			if s.Name == "" || s.Namespace == "" {
				t.Fatalf("slice without identity: %+v", s.ObjectMeta)
			}
		}
	})
}
