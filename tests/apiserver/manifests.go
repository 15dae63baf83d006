package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// ModulePath is the main module whose root [RepoRoot] looks for.
const ModulePath = "github.com/xdplb/xdplb"

// RepoRoot walks up from the working directory (a test's package
// directory) to the directory whose go.mod declares [ModulePath].
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("getting working directory: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(data, ModulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod for %s above the working directory", ModulePath)
		}
		dir = parent
	}
}

func declaresModule(goMod []byte, module string) bool {
	sc := bufio.NewScanner(bytes.NewReader(goMod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == module {
			return true
		}
	}
	return false
}

// DeployDir is the repository's deploy/ directory.
func DeployDir() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy"), nil
}

// Kustomization is the part of a kustomization.yaml that the tests read.
// Only plain resource files are supported (no bases, generators or
// patches), which keeps the manifests usable with `kubectl apply -f` too.
type Kustomization struct {
	// Dir is the directory the file was read from.
	Dir       string           `json:"-"`
	Namespace string           `json:"namespace,omitempty"`
	Resources []string         `json:"resources"`
	Images    []KustomizeImage `json:"images,omitempty"`
}

// KustomizeImage is one entry of a kustomization's images list.
type KustomizeImage struct {
	Name    string `json:"name"`
	NewName string `json:"newName,omitempty"`
	NewTag  string `json:"newTag,omitempty"`
	Digest  string `json:"digest,omitempty"`
}

// Manifest is one object read from a resource file.
type Manifest struct {
	// Source is the file the object came from, relative to the
	// kustomization, with the document's index when it holds several.
	Source string
	Object *unstructured.Unstructured
}

// ReadKustomization reads dir/kustomization.yaml.
func ReadKustomization(dir string) (*Kustomization, error) {
	path := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading kustomization: %w", err)
	}
	k := &Kustomization{Dir: dir}
	if err := yaml.Unmarshal(data, k); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	if len(k.Resources) == 0 {
		return nil, fmt.Errorf("%s lists no resources", path)
	}
	return k, nil
}

// Manifests parses every document of every file in Resources, in order.
// Each document must be a single object with apiVersion, kind and name.
func (k *Kustomization) Manifests() ([]Manifest, error) {
	var out []Manifest
	for _, res := range k.Resources {
		if filepath.IsAbs(res) || strings.Contains(res, "://") {
			return nil, fmt.Errorf("resource %q: only relative file paths are supported", res)
		}
		path := filepath.Join(k.Dir, res)
		fi, err := os.Stat(path)
		if err != nil {
			return nil, fmt.Errorf("resource %q: %w", res, err)
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("resource %q is a directory; only files are supported", res)
		}
		objs, err := parseManifestFile(path)
		if err != nil {
			return nil, err
		}
		for i, obj := range objs {
			src := res
			if len(objs) > 1 {
				src = fmt.Sprintf("%s#%d", res, i)
			}
			out = append(out, Manifest{Source: src, Object: obj})
		}
	}
	return out, nil
}

func parseManifestFile(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening manifest: %w", err)
	}
	defer f.Close()
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s document %d: %w", path, i, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("parsing %s document %d: %w", path, i, err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "" || s == "{}" {
			continue // empty document (comments only)
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("decoding %s document %d: %w", path, i, err)
		}
		if obj.IsList() {
			return nil, fmt.Errorf("%s document %d: lists are not supported", path, i)
		}
		if obj.GetName() == "" {
			return nil, fmt.Errorf("%s document %d (%s): no metadata.name", path, i, obj.GetKind())
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s holds no objects", path)
	}
	return objs, nil
}

// FieldManager is the server-side apply field manager of [Server.Apply].
const FieldManager = "xdplb-tests"

// Apply server-side applies objs in order, as the admin, with strict field
// validation (unknown or duplicate fields are errors) and forced ownership.
func (s *Server) Apply(ctx context.Context, objs ...*unstructured.Unstructured) error {
	return s.apply(ctx, false, objs)
}

// DryRunApply is [Server.Apply] with dryRun=All: the server runs defaulting,
// validation and admission and persists nothing.
func (s *Server) DryRunApply(ctx context.Context, objs ...*unstructured.Unstructured) error {
	return s.apply(ctx, true, objs)
}

func (s *Server) apply(ctx context.Context, dryRun bool, objs []*unstructured.Unstructured) error {
	cfg := s.AdminConfig()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating dynamic client: %w", err)
	}
	groups, err := restmapper.GetAPIGroupResources(s.client.Discovery())
	if err != nil {
		return fmt.Errorf("discovering API resources: %w", err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	force := true
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: &force, FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		desc := fmt.Sprintf("%s %s", gvk.Kind, obj.GetName())
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("applying %s: unknown kind: %w", desc, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				return fmt.Errorf("applying %s: namespaced object without metadata.namespace", desc)
			}
			desc = fmt.Sprintf("%s %s/%s", gvk.Kind, obj.GetNamespace(), obj.GetName())
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		} else if obj.GetNamespace() != "" {
			return fmt.Errorf("applying %s: cluster-scoped object with metadata.namespace %q", desc, obj.GetNamespace())
		}
		data, err := json.Marshal(obj.Object)
		if err != nil {
			return fmt.Errorf("encoding %s: %w", desc, err)
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts); err != nil {
			return fmt.Errorf("applying %s (dry run %v): %w", desc, dryRun, err)
		}
	}
	return nil
}
