package health

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestTrackerFollowsKubeProxyRule(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	tr := NewTracker(time.Minute, "node-a", c.now)
	sync := func() { tr.Updated(c.t) }
	steps := []struct {
		name string
		do   func()
		want bool
	}{
		{"never synced", func() {}, false},
		{"synced", sync, true},
		{"change queued", tr.Queued, true},
		{"queued 59s", func() { c.t = c.t.Add(59 * time.Second) }, true},
		{"queued 61s", func() { c.t = c.t.Add(2 * time.Second) }, false},
		{"applied", sync, true},
		{"idle an hour", func() { c.t = c.t.Add(time.Hour) }, true},
	}
	for _, s := range steps {
		s.do()
		if got, _ := tr.Healthy(); got != s.want {
			t.Fatalf("%s: healthy=%v, want %v", s.name, got, s.want)
		}
	}
}

// Under a steady stream of changes, each sync applies what was queued
// before it read the state while new changes arrive during it: the agent
// stays healthy while syncs keep completing, and turns unhealthy once a
// change waits longer than the timeout.
func TestTrackerStaysHealthyUnderChurn(t *testing.T) {
	c := &clock{t: time.Unix(1000, 0)}
	tr := NewTracker(time.Minute, "", c.now)
	tr.Updated(c.t)
	for i := 0; i < 300; i++ {
		tr.Queued()
		readAt := c.t.Add(time.Second)
		c.t = readAt.Add(time.Second) // a change arrives while the sync runs
		tr.Queued()
		c.t = c.t.Add(time.Second)
		tr.Updated(readAt)
		if ok, _ := tr.Healthy(); !ok {
			t.Fatalf("unhealthy after %d syncs of %v each under churn", i+1, 3*time.Second)
		}
	}
	// The change queued during the last sync is still waiting.
	c.t = c.t.Add(58 * time.Second)
	if ok, _ := tr.Healthy(); ok {
		t.Fatal("healthy although a change has waited over a minute")
	}
	tr.Updated(c.t)
	if ok, _ := tr.Healthy(); !ok {
		t.Fatal("unhealthy after a sync applied everything")
	}
}

func TestHealthzBody(t *testing.T) {
	c := &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tr := NewTracker(time.Minute, "node-a", c.now)
	srv := httptest.NewServer(tr.Handler())
	defer srv.Close()

	get := func(path string) (int, Status) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st Status
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, st
	}
	if code, _ := get("/healthz"); code != 503 {
		t.Fatalf("before the first sync: %d, want 503", code)
	}
	tr.Updated(c.t)
	code, st := get("/livez")
	if code != 200 || !st.LastUpdated.Equal(c.t) || st.NodeName != "node-a" || st.Stale {
		t.Fatalf("after sync: %d %+v", code, st)
	}
	tr.SourceError("API server unreachable", c.t.Add(-time.Minute))
	code, st = get("/healthz")
	if code != 200 || !st.Stale || st.StaleError != "API server unreachable" {
		t.Fatalf("stale source must be reported but keep the node healthy: %d %+v", code, st)
	}
}

func TestNodePortServers(t *testing.T) {
	tr := NewTracker(time.Minute, "", nil)
	tr.Updated(time.Now())
	n := NewNodePortServers(tr, "127.0.0.1", nil)
	defer n.Close()
	port := freePort(t)
	get := func() (int, string) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if err := n.Sync([]ServiceHealth{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 2}}); err != nil {
		t.Fatal(err)
	}
	if code, body := get(); code != 200 || body != `{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}`+"\n" {
		t.Fatalf("with local endpoints: %d %s", code, body)
	}
	n.Sync([]ServiceHealth{{Namespace: "ns", Name: "web", Port: port, LocalEndpoints: 0}})
	if code, _ := get(); code != 503 {
		t.Fatalf("without local endpoints: %d, want 503", code)
	}
	n.Sync(nil)
	if code, _ := get(); code != 0 {
		t.Fatalf("server still answers after removal: %d", code)
	}
}

func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}
