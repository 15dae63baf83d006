package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// ServiceHealth is what a healthCheckNodePort reports for one Service.
type ServiceHealth struct {
	Namespace, Name string
	Port            uint16 // the healthCheckNodePort
	LocalEndpoints  int
}

// NodePortServers runs one HTTP server per healthCheckNodePort. A load
// balancer sends traffic for an externalTrafficPolicy Local Service only
// to nodes whose server answers 200: those with a local endpoint and a
// healthy agent.
type NodePortServers struct {
	mu      sync.Mutex
	tracker *Tracker
	log     *slog.Logger
	bind    string // address to listen on, "" for all
	servers map[uint16]*nodePortServer
}

type nodePortServer struct {
	mu     sync.Mutex
	svc    ServiceHealth
	server *http.Server
	done   chan struct{}
}

// NewNodePortServers returns an empty set of servers listening on bindIP
// ("" for all addresses).
func NewNodePortServers(tracker *Tracker, bindIP string, log *slog.Logger) *NodePortServers {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &NodePortServers{tracker: tracker, log: log, bind: bindIP, servers: map[uint16]*nodePortServer{}}
}

// Sync starts servers for new ports, updates the counts of existing ones
// and stops those no longer wanted. A port that cannot be bound is
// reported and retried on the next Sync.
func (n *NodePortServers) Sync(want []ServiceHealth) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	wanted := map[uint16]ServiceHealth{}
	for _, s := range want {
		wanted[s.Port] = s
	}
	for port, srv := range n.servers {
		if _, ok := wanted[port]; !ok {
			srv.stop()
			delete(n.servers, port)
		}
	}
	var errs []error
	for port, s := range wanted {
		if srv, ok := n.servers[port]; ok {
			srv.mu.Lock()
			srv.svc = s
			srv.mu.Unlock()
			continue
		}
		srv, err := n.start(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n.servers[port] = srv
	}
	return errors.Join(errs...)
}

func (n *NodePortServers) start(s ServiceHealth) (*nodePortServer, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(n.bind, strconv.Itoa(int(s.Port))))
	if err != nil {
		return nil, fmt.Errorf("health check node port %d of %s/%s: %w", s.Port, s.Namespace, s.Name, err)
	}
	srv := &nodePortServer{svc: s, done: make(chan struct{})}
	srv.server = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		srv.mu.Lock()
		svc := srv.svc
		srv.mu.Unlock()
		healthy, _ := n.tracker.Healthy()
		body := struct {
			Service struct {
				Namespace string `json:"namespace"`
				Name      string `json:"name"`
			} `json:"service"`
			LocalEndpoints      int  `json:"localEndpoints"`
			ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
		}{LocalEndpoints: svc.LocalEndpoints, ServiceProxyHealthy: healthy}
		body.Service.Namespace, body.Service.Name = svc.Namespace, svc.Name
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if svc.LocalEndpoints == 0 || !healthy {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(body)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(srv.done)
		if err := srv.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("health check node port server failed", "port", s.Port, "error", err)
		}
	}()
	n.log.Info("health check node port serving", "port", s.Port, "service", s.Namespace+"/"+s.Name)
	return srv, nil
}

func (s *nodePortServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.server.Shutdown(ctx)
	<-s.done
}

// Close stops every server.
func (n *NodePortServers) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for port, srv := range n.servers {
		srv.stop()
		delete(n.servers, port)
	}
}
