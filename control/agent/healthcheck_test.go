package agent

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/health"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/source"
	"github.com/xdplb/xdplb/tests/testenv"
)

// slowSnapshots is an in-memory source whose snapshots take a while, as
// listing thousands of objects does, so changes keep arriving during syncs.
type slowSnapshots struct{ *memorySource }

func (s slowSnapshots) Snapshot() source.Snapshot {
	time.Sleep(10 * time.Millisecond)
	return s.memorySource.Snapshot()
}

// A change every few milliseconds, each applied by the next sync or the
// one after, must not make the agent unhealthy: the probe would restart it
// in the middle of a rollout and load balancers would drop the node.
func TestAgentStaysHealthyUnderSteadyChurn(t *testing.T) {
	opts, dp := loadSmallDatapath(t)
	src := slowSnapshots{newMemorySource()}
	src.put(hintsService("10.244.1.10"))
	cfg := smallAgentConfig(opts)
	cfg.HealthTimeout = 300 * time.Millisecond
	a, err := assemble(cfg, discard(), src, dp)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	deadline := time.Now().Add(10 * time.Second)
	for ok, _ := a.tracker.Healthy(); !ok; ok, _ = a.tracker.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("never healthy")
		}
		time.Sleep(10 * time.Millisecond)
	}
	churnUntil := time.Now().Add(4 * cfg.HealthTimeout)
	for time.Now().Before(churnUntil) {
		a.notify()
		time.Sleep(3 * time.Millisecond)
		if ok, last := a.tracker.Healthy(); !ok {
			t.Fatalf("unhealthy under churn; last sync %v ago", time.Since(last).Round(time.Millisecond))
		}
	}
}

func TestHealthCheckNodePortsCountLocalReadyAddresses(t *testing.T) {
	pod := func(addr string, port uint16, local, ready bool) model.Endpoint {
		return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: port, Local: local,
			Ready: ready, Serving: true, Terminating: !ready, Weight: 1}
	}
	port := func(name string, hc uint16, eps ...model.Endpoint) model.Service {
		return model.Service{Namespace: "default", Name: "lb", PortName: name, HealthCheckNodePort: hc, Endpoints: eps}
	}
	for _, c := range []struct {
		name  string
		ports []model.Service
		want  int // local endpoints answered on port 32000
	}{
		{"one local ready endpoint", []model.Service{port("http", 32000, pod("10.244.0.5", 8080, true, true))}, 1},
		{"only a terminating local endpoint: drain the node", []model.Service{
			port("http", 32000, pod("10.244.0.5", 8080, true, false))}, 0},
		{"ready endpoints elsewhere only", []model.Service{port("http", 32000, pod("10.244.1.5", 8080, false, true))}, 0},
		{"one pod behind two ports counts once", []model.Service{
			port("http", 32000, pod("10.244.0.5", 8080, true, true)),
			port("https", 32000, pod("10.244.0.5", 8443, true, true))}, 1},
		{"ready pods of different ports add up", []model.Service{
			port("http", 32000, pod("10.244.0.5", 8080, true, true), pod("10.244.0.6", 8080, true, false)),
			port("https", 32000, pod("10.244.0.7", 8443, true, true))}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := healthCheckNodePorts(model.State{Services: append(c.ports,
				model.Service{Namespace: "default", Name: "plain", PortName: "http"})})
			want := []health.ServiceHealth{{Namespace: "default", Name: "lb", Port: 32000, LocalEndpoints: c.want}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

// A transient failure to read an interface keeps the NodePort addresses of
// the last complete read instead of withdrawing NodePorts.
func TestNodeAddressesSurviveAnUnreadableInterface(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns, peer := testenv.NewNetns(t, "addrs"), testenv.NewNetns(t, "peer")
	testenv.Veth(t, ns, "nic0", peer, "p-nic0")
	ns.IP("addr", "add", "192.0.2.7/24", "dev", "nic0")
	want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	a := &Agent{cfg: Config{Interfaces: []string{"nic0"}}, log: discard()}
	fresh := &Agent{cfg: Config{Interfaces: []string{"nosuch0"}}, log: discard()}
	var first, kept, none []netip.Addr
	err := ns.Do(func() error {
		first = a.nodeAddresses(source.Snapshot{})
		a.cfg.Interfaces = []string{"nosuch0"}
		kept = a.nodeAddresses(source.Snapshot{})
		none = fresh.nodeAddresses(source.Snapshot{})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("addresses of nic0: %v, want %v", first, want)
	}
	if !reflect.DeepEqual(kept, want) {
		t.Errorf("after a failed read: %v, want the last complete list %v", kept, want)
	}
	if len(none) != 0 {
		t.Errorf("nothing read yet and the interface unreadable: %v, want none", none)
	}
}
