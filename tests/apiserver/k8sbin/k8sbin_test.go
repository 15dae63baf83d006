package k8sbin

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestStagingModules(t *testing.T) {
	goMod := []byte(`module k8s.io/kubernetes

go 1.26.0

require (
	k8s.io/api v0.0.0
	k8s.io/apimachinery v0.0.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/apimachinery => ./staging/src/k8s.io/apimachinery // comment
	example.com/other => example.com/other v1.2.3
)

replace k8s.io/client-go => ./staging/src/k8s.io/client-go
`)
	got, err := stagingModules(goMod)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go"}
	if !slices.Equal(got, want) {
		t.Errorf("stagingModules = %v, want %v", got, want)
	}
	if _, err := stagingModules([]byte("module x\n")); err == nil {
		t.Error("a go.mod without staging replacements must be an error")
	}
}

func TestStagingVersionFor(t *testing.T) {
	if v, err := stagingVersionFor("v1.37.2"); err != nil || v != "v0.37.2" {
		t.Errorf("stagingVersionFor(v1.37.2) = %q, %v", v, err)
	}
	if _, err := stagingVersionFor("v2.0.0"); err == nil {
		t.Error("want an error for a non-v1 version")
	}
}

func TestLockFileExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := lockFile(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 700*time.Millisecond)
	defer cancel()
	if _, err := lockFile(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lock while held: got %v, want a deadline error", err)
	}
	unlock()
	unlock2, err := lockFile(t.Context(), path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	unlock2()
}

func TestDirOverride(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvBinDir, dir)
	got, err := Dir()
	if err != nil || got != dir {
		t.Errorf("Dir() = %q, %v; want %q", got, err, dir)
	}
	if _, ok := Cached(); ok {
		t.Error("Cached() reports binaries in an empty directory")
	}
}
