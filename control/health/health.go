// Package health serves the agent's health endpoints the way kube-proxy
// does, so existing load balancer health checks and probes keep working:
// /healthz and /livez on the healthz address, and one server per
// healthCheckNodePort of a LoadBalancer Service with
// externalTrafficPolicy Local.
package health

import (
	"encoding/json"
	"net/http"
	"sync"
	"time"
)

// Tracker records when changes were queued and applied, and decides
// whether the agent is healthy: it is not when a change has waited longer
// than the timeout without being applied (kube-proxy's rule).
type Tracker struct {
	mu          sync.Mutex
	now         func() time.Time
	timeout     time.Duration
	nodeName    string
	lastUpdated time.Time // last successful sync
	oldestQueue time.Time // the oldest change not yet applied; zero if none
	latestQueue time.Time // the latest change queued
	sourceErr   string
	sourceSince time.Time
}

// NewTracker returns a tracker; now may be nil (time.Now).
func NewTracker(timeout time.Duration, nodeName string, now func() time.Time) *Tracker {
	if now == nil {
		now = time.Now
	}
	return &Tracker{timeout: timeout, nodeName: nodeName, now: now}
}

// Queued notes that a change is waiting to be applied.
func (t *Tracker) Queued() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if t.oldestQueue.IsZero() {
		t.oldestQueue = now
	}
	t.latestQueue = now
}

// Updated notes a successful sync of the state read at readAt: every
// change queued before then is applied. Changes queued while the sync ran
// count as waiting since readAt, so a steady stream of changes, each
// applied by the next sync, keeps the agent healthy as long as syncs keep
// completing (kube-proxy forgets such changes instead).
func (t *Tracker) Updated(readAt time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lastUpdated = t.now()
	switch {
	case t.latestQueue.Before(readAt):
		t.oldestQueue = time.Time{}
	case t.oldestQueue.Before(readAt):
		t.oldestQueue = readAt
	}
}

// SourceError records the state of the source of truth: a non-empty
// message while it cannot be read (the API server unreachable, a broken
// services file), with the time it started. Traffic keeps following the
// last good state meanwhile; the endpoints report the staleness.
func (t *Tracker) SourceError(msg string, since time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sourceErr, t.sourceSince = msg, since
}

// Healthy reports the verdict and the time of the last sync.
func (t *Tracker) Healthy() (bool, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.healthyLocked(), t.lastUpdated
}

func (t *Tracker) healthyLocked() bool {
	if t.lastUpdated.IsZero() {
		return false
	}
	return t.oldestQueue.IsZero() || t.now().Sub(t.oldestQueue) < t.timeout
}

// Status is the JSON body of /healthz and /livez.
type Status struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeName     string    `json:"nodeName,omitempty"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
	// Stale is set while the source of truth cannot be read: the
	// datapath follows the last good state.
	Stale      bool       `json:"stale,omitempty"`
	StaleSince *time.Time `json:"staleSince,omitempty"`
	StaleError string     `json:"staleError,omitempty"`
}

func (t *Tracker) status() (Status, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Status{LastUpdated: t.lastUpdated, CurrentTime: t.now(), NodeName: t.nodeName}
	eligible := true
	st.NodeEligible = &eligible
	if t.sourceErr != "" {
		since := t.sourceSince
		st.Stale, st.StaleSince, st.StaleError = true, &since, t.sourceErr
	}
	return st, t.healthyLocked()
}

// Handler serves /healthz and /livez.
func (t *Tracker) Handler() http.Handler {
	mux := http.NewServeMux()
	serve := func(w http.ResponseWriter, _ *http.Request) {
		st, ok := t.status()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(st)
	}
	mux.HandleFunc("/healthz", serve)
	mux.HandleFunc("/livez", serve)
	return mux
}
