package manifests_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/xdplb/xdplb/tests/apiserver"
)

const mib = 1 << 20

// measured holds the figures docs/performance.md's table reports for
// the agent at 10k Services: the largest RSS seen, the GOMEMLIMIT it was
// measured under, and the BPF map memory at the default flags. The
// DaemonSet is checked against them, so the two cannot drift apart.
type measured struct {
	rssMiB, goMemLimitMiB, mapsMiB int64
}

// readmeFigures extracts measured from docs/performance.md.
func readmeFigures(t *testing.T) measured {
	t.Helper()
	root, err := apiserver.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "docs", "performance.md"))
	if err != nil {
		t.Fatal(err)
	}
	find := func(re string) []int64 {
		t.Helper()
		m := regexp.MustCompile(re).FindSubmatch(raw)
		if m == nil {
			t.Fatalf("docs/performance.md: no match for %s (the performance table's memory figures)", re)
		}
		var out []int64
		for _, s := range m[1:] {
			n, err := strconv.ParseInt(string(s), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	first := find(`agent memory at 10k Services[^|]*\| \d+–(\d+) MiB after the first sync`)
	limited := find("\\d+–(\\d+) MiB under `GOMEMLIMIT=(\\d+)MiB`")
	maps := find(`BPF map memory at 10k Services, default flags \| (\d+) MiB`)
	return measured{rssMiB: max(first[0], limited[0]), goMemLimitMiB: limited[1], mapsMiB: maps[0]}
}

// TestResourcesMatchMeasurements checks the agent container's memory
// settings against the measured figures: GOMEMLIMIT is the one measured
// under; the request holds the agent's RSS and the BPF maps it creates
// (map memory is charged to the creating process's memory cgroup); the
// limit also holds a second copy of the maps, which coexist while a
// resize migrates them.
func TestResourcesMatchMeasurements(t *testing.T) {
	d := load(t)
	fig := readmeFigures(t)
	c := d.ds.Spec.Template.Spec.Containers[0]

	var goMemLimit string
	for _, e := range c.Env {
		if e.Name == "GOMEMLIMIT" {
			goMemLimit = e.Value
		}
	}
	req, hasReq := c.Resources.Requests[corev1.ResourceMemory]
	lim, hasLim := c.Resources.Limits[corev1.ResourceMemory]
	for _, tc := range []struct {
		name string
		ok   bool
		want string
	}{
		{"GOMEMLIMIT", goMemLimit == strconv.FormatInt(fig.goMemLimitMiB, 10)+"MiB",
			"the " + strconv.FormatInt(fig.goMemLimitMiB, 10) + "MiB docs/performance.md's figures were measured under"},
		{"requests.memory", hasReq && req.Value() >= (fig.rssMiB+fig.mapsMiB)*mib,
			"at least the measured RSS plus the BPF maps: " + strconv.FormatInt(fig.rssMiB+fig.mapsMiB, 10) + "Mi"},
		{"limits.memory", hasLim && lim.Value() >= (fig.rssMiB+2*fig.mapsMiB)*mib && lim.Cmp(req) >= 0,
			"at least the request and the RSS plus two copies of the BPF maps (a resize): " +
				strconv.FormatInt(fig.rssMiB+2*fig.mapsMiB, 10) + "Mi"},
	} {
		if !tc.ok {
			got := map[string]string{"GOMEMLIMIT": goMemLimit, "requests.memory": quantity(req, hasReq),
				"limits.memory": quantity(lim, hasLim)}[tc.name]
			t.Errorf("%s = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func quantity(q resource.Quantity, ok bool) string {
	if !ok {
		return "unset"
	}
	return q.String()
}

// TestProbeWindows checks how long each probe lets the agent go without
// answering. A start may resize the conntrack (about 40 s measured at the
// largest sizes) before /healthz answers: the startup probe must wait up
// to five minutes, and liveness must not run until it has succeeded.
func TestProbeWindows(t *testing.T) {
	d := load(t)
	c := d.ds.Spec.Template.Spec.Containers[0]
	window := func(p *corev1.Probe) time.Duration {
		period := max(p.PeriodSeconds, 10) // the API's default when unset
		failures := max(p.FailureThreshold, 3)
		return time.Duration(p.InitialDelaySeconds+period*failures) * time.Second
	}
	checkProbe(t, "startup", c.StartupProbe, "/healthz", c)
	if c.StartupProbe == nil {
		return
	}
	for _, tc := range []struct {
		name     string
		probe    *corev1.Probe
		min, max time.Duration
	}{
		{"startup", c.StartupProbe, 5 * time.Minute, 10 * time.Minute},
		{"liveness", c.LivenessProbe, 10 * time.Second, 2 * time.Minute},
	} {
		if w := window(tc.probe); w < tc.min || w > tc.max {
			t.Errorf("%s probe gives up after %s, want %s to %s", tc.name, w, tc.min, tc.max)
		}
	}
	if p := c.StartupProbe; p.SuccessThreshold > 1 {
		t.Errorf("startup probe successThreshold %d: the API allows only 1", p.SuccessThreshold)
	}
}
