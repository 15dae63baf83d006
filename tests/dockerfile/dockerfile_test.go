// Package dockerfile checks the image build without a Docker engine: the
// Dockerfile builds the binary with exactly the Makefile's build recipe,
// from the committed BPF objects, stamping the VERSION build argument into
// the binary, into a runtime image whose default command is `xdplb agent`; the DaemonSet in deploy/ runs that image under
// the name the Dockerfile documents; and .dockerignore leaves every file the
// build needs in the context.
package dockerfile

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/xdplb/xdplb/tests/testenv"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
	line int
}

// stage is a FROM and what follows it.
type stage struct {
	from, name string
	insns      []instruction
}

// parseDockerfile splits a Dockerfile into stages of instructions; it
// also returns the comment lines.
func parseDockerfile(t *testing.T, text string) ([]stage, []string) {
	t.Helper()
	var stages []stage
	var comments []string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			comments = append(comments, strings.TrimSpace(strings.TrimPrefix(line, "#")))
			continue
		}
		start := i + 1
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			next := strings.TrimSpace(lines[i])
			if strings.HasPrefix(next, "#") {
				continue
			}
			line = strings.TrimSuffix(line, `\`) + " " + next
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("Dockerfile line %d: %s before FROM", start, in.cmd)
			}
			continue
		}
		stages[len(stages)-1].insns = append(stages[len(stages)-1].insns, in)
	}
	return stages, comments
}

// execForm parses the JSON (exec) form of ENTRYPOINT and CMD.
func execForm(t *testing.T, in instruction) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		t.Fatalf("Dockerfile line %d: %s %s is not in exec form (a JSON array): %v", in.line, in.cmd, in.args, err)
	}
	return v
}

// makeRecipe returns the recipe of a Makefile target with the Makefile's
// own variables expanded, except those in override, which take the value
// given there (as `make NAME=value` would).
func makeRecipe(t *testing.T, makefile, target string, override map[string]string) []string {
	t.Helper()
	vars := map[string]string{}
	assign := regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_]*)\s*(\?=|:=|=)\s*(.*)$`)
	var recipe []string
	in := false
	for _, line := range strings.Split(makefile, "\n") {
		if m := assign.FindStringSubmatch(line); m != nil && !strings.HasPrefix(line, "\t") {
			vars[m[1]] = strings.TrimSpace(m[3])
			if v, ok := override[m[1]]; ok {
				vars[m[1]] = v
			}
		}
		switch {
		case strings.HasPrefix(line, target+":"):
			in = true
		case in && strings.HasPrefix(line, "\t"):
			recipe = append(recipe, strings.TrimSpace(line))
		case in:
			in = false
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for i, r := range recipe {
		for ref.MatchString(r) {
			r = ref.ReplaceAllStringFunc(r, func(m string) string {
				name := ref.FindStringSubmatch(m)[1]
				v, ok := vars[name]
				if !ok {
					t.Fatalf("Makefile: $(%s) in the %s recipe is not set in the Makefile", name, target)
				}
				return v
			})
		}
		recipe[i] = strings.TrimPrefix(r, "@")
	}
	if len(recipe) == 0 {
		t.Fatalf("Makefile has no recipe for %s", target)
	}
	return recipe
}

func read(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDockerfile(t *testing.T) {
	root := testenv.RepoRoot(t)
	stages, comments := parseDockerfile(t, read(t, root, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build (builder and runtime), have %d stage(s)", len(stages))
	}
	build, runtime := stages[0], stages[len(stages)-1]

	// The builder's Go is the one go.mod asks for.
	goDirective := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(read(t, root, "go.mod"))
	if goDirective == nil {
		t.Fatal("go.mod has no go directive")
	}
	if want := "golang:" + goDirective[1] + "-"; !strings.HasPrefix(build.from, want) || build.name == "" {
		t.Errorf("build stage FROM %s AS %q: want %s<debian release> AS <name> (go.mod says go %s)",
			build.from, build.name, want, goDirective[1])
	}

	// Exactly one build command, and it is `make build`'s recipe, with the
	// version the image is built with (its VERSION build argument) where
	// the Makefile puts its own VERSION.
	recipe := makeRecipe(t, read(t, root, "Makefile"), "build", map[string]string{"VERSION": "${" + versionArg + "}"})
	var builds []instruction
	for _, st := range stages {
		for _, in := range st.insns {
			if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
				builds = append(builds, in)
			}
			if in.cmd == "RUN" && regexp.MustCompile(`\b(clang|llvm|go generate|make generate|bpf2go)\b`).MatchString(in.args) {
				t.Errorf("Dockerfile line %d: %q: the image builds from the committed BPF objects, without clang", in.line, in.args)
			}
		}
	}
	if len(builds) != 1 || len(recipe) != 1 || builds[0].args != recipe[0] {
		t.Errorf("Dockerfile go build steps %v, want exactly the Makefile's build recipe %q", builds, recipe)
	}
	testenv.RequireCommand(t, "make")
	const probe = "v0.0.0-probe"
	out, err := exec.Command("make", "-s", "-n", "-C", root, "VERSION="+probe, "build").Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	if len(builds) == 1 {
		got, want := strings.TrimSpace(string(out)), strings.ReplaceAll(builds[0].args, "${"+versionArg+"}", probe)
		if got != want {
			t.Errorf("make -n VERSION=%s build runs %q, the Dockerfile %q", probe, got, want)
		}
	}
	checkVersionStamp(t, root, build, builds)

	// The runtime stage: the binary from the builder, nothing to compile.
	if strings.HasPrefix(runtime.from, "golang:") {
		t.Errorf("runtime stage FROM %s: want a small runtime image, not the Go toolchain", runtime.from)
	}
	binary := "/usr/local/bin/xdplb"
	var entrypoint, cmd []string
	copied := false
	for _, in := range runtime.insns {
		switch in.cmd {
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+build.name && f[2] == binary &&
				path.Clean(f[1]) == path.Join(workdir(build), "bin/xdplb") {
				copied = true
			}
		case "ENTRYPOINT":
			entrypoint = execForm(t, in)
		case "CMD":
			cmd = execForm(t, in)
		case "RUN":
			t.Errorf("Dockerfile line %d: RUN in the runtime stage: the image needs nothing but the binary", in.line)
		}
	}
	if !copied {
		t.Errorf("runtime stage does not COPY --from=%s %s/bin/xdplb (the `make build` output) to %s", build.name, workdir(build), binary)
	}
	if def := append(slices.Clone(entrypoint), cmd...); !slices.Equal(def, []string{binary, "agent"}) {
		t.Errorf("the image runs %q by default (ENTRYPOINT %q, CMD %q), want %q", def, entrypoint, cmd, []string{binary, "agent"})
	}

	// The DaemonSet runs this image, named as the Dockerfile documents,
	// and its command line becomes `xdplb agent`.
	var image, documented string
	for _, c := range comments {
		if m := regexp.MustCompile(`docker build (?:.* )?-t (\S+?)(:\S+)? \.$`).FindStringSubmatch(c); m != nil {
			image, documented = m[1], c
		}
	}
	if image == "" {
		t.Fatal("the Dockerfile does not document its image name (`docker build -t NAME:TAG .`)")
	}
	if !strings.Contains(documented, "--build-arg "+versionArg+"=") {
		t.Errorf("the documented build %q does not pass --build-arg %s=...: the image would report the default version", documented, versionArg)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(read(t, root, "deploy/daemonset.yaml")), &ds); err != nil {
		t.Fatal(err)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if name, _, _ := strings.Cut(c.Image, ":"); name != image {
			t.Errorf("deploy/daemonset.yaml container %s runs image %s, the Dockerfile builds %s", c.Name, c.Image, image)
		}
		run := c.Command
		if len(run) == 0 {
			run = entrypoint
		}
		args := c.Args
		if len(c.Command) == 0 && len(args) == 0 {
			args = cmd
		}
		if got := append(slices.Clone(run), args...); !slices.Equal(got, []string{binary, "agent"}) {
			t.Errorf("deploy/daemonset.yaml container %s runs %q with this image, want %q", c.Name, got, []string{binary, "agent"})
		}
	}
	if !strings.Contains(read(t, root, "deploy/kustomization.yaml"), "name: "+image) {
		t.Errorf("deploy/kustomization.yaml has no images entry for %s", image)
	}
}

// versionArg is the build argument that carries the version into the
// image's binary.
const versionArg = "VERSION"

// checkVersionStamp checks that the image's binary gets its version: the
// build stage declares the VERSION argument (with a default) before the
// build, the build sets it with -ldflags -X on a string variable that
// exists in cmd/xdplb (-X on a missing one is silently ignored), and the
// Makefile's VERSION comes from git describe.
func checkVersionStamp(t *testing.T, root string, build stage, builds []instruction) {
	t.Helper()
	if len(builds) != 1 {
		return
	}
	declared := false
	for _, in := range build.insns {
		if in.cmd == "ARG" && strings.HasPrefix(in.args, versionArg+"=") && len(in.args) > len(versionArg)+1 {
			declared = true
		}
		if in.line == builds[0].line {
			break
		}
	}
	if !declared {
		t.Errorf("the build stage does not declare ARG %s=<default> before its build", versionArg)
	}
	m := regexp.MustCompile(`-X '?([\w./-]+)\.(\w+)=\$\{` + versionArg + `\}`).FindStringSubmatch(builds[0].args)
	if m == nil {
		t.Fatalf("the build %q does not stamp the version: want -ldflags \"-X main.<var>=${%s}\"", builds[0].args, versionArg)
	}
	if m[1] != "main" || !hasStringVar(t, filepath.Join(root, "cmd/xdplb"), m[2]) {
		t.Errorf("-X %s.%s: cmd/xdplb (package main) has no string variable %s", m[1], m[2], m[2])
	}
	vars := regexp.MustCompile(`(?m)^` + versionArg + `\s*\?=\s*(.*)$`).FindStringSubmatch(read(t, root, "Makefile"))
	if vars == nil || !strings.Contains(vars[1], "git describe") {
		t.Errorf("Makefile: want %s ?= <from git describe>, so a build outside the image also has its version", versionArg)
	}
}

// hasStringVar reports whether the package in dir declares a package-level
// variable name initialised with a string constant.
func hasStringVar(t *testing.T, dir, name string) bool {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range file.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, n := range vs.Names {
					if n.Name != name || i >= len(vs.Values) {
						continue
					}
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						return true
					}
				}
			}
		}
	}
	return false
}

func workdir(st stage) string {
	dir := "/"
	for _, in := range st.insns {
		if in.cmd == "WORKDIR" {
			dir = path.Join(dir, in.args)
		}
	}
	return dir
}

// dockerignore is a .dockerignore: patterns matched against slash paths
// relative to the context, a later "!" pattern re-including.
type dockerignore []string

func (d dockerignore) ignored(p string) bool {
	out := false
	for _, pat := range d {
		neg := strings.HasPrefix(pat, "!")
		pat = strings.TrimPrefix(strings.TrimPrefix(pat, "!"), "/")
		if matchIgnore(pat, p) {
			out = !neg
		}
	}
	return out
}

// matchIgnore matches the path or one of its parent directories; "**"
// matches any number of directories.
func matchIgnore(pat, p string) bool {
	parts := strings.Split(p, "/")
	for i := 1; i <= len(parts); i++ {
		if globMatch(strings.Split(pat, "/"), parts[:i]) {
			return true
		}
	}
	return false
}

func globMatch(pat, parts []string) bool {
	if len(pat) == 0 {
		return len(parts) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(parts); i++ {
			if globMatch(pat[1:], parts[i:]) {
				return true
			}
		}
		return false
	}
	if len(parts) == 0 {
		return false
	}
	ok, err := path.Match(pat[0], parts[0])
	return err == nil && ok && globMatch(pat[1:], parts[1:])
}

func TestDockerignoreKeepsTheBuildInputs(t *testing.T) {
	root := testenv.RepoRoot(t)
	var ig dockerignore
	for _, line := range strings.Split(read(t, root, ".dockerignore"), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			ig = append(ig, line)
		}
	}
	// The matcher itself.
	for p, want := range map[string]bool{".git/config": true, "bin/xdplb": true, "xdplb": true, "cmd/xdplb/main.go": false,
		"control/agent/agent.test": true, "go.mod": false} {
		if got := ig.ignored(p); got != want {
			t.Errorf(".dockerignore: %s ignored = %v, want %v", p, got, want)
		}
	}

	// Every file of every package of this module that the binary is built
	// from, the embedded BPF objects included, and go.mod and go.sum.
	gocmd := testenv.RequireCommand(t, "go")
	out, err := exec.Command(gocmd, "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}{{end}}`, "github.com/xdplb/xdplb/cmd/xdplb").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	files := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	embedded := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".o") {
			embedded++
		}
		if ig.ignored(f) {
			t.Errorf(".dockerignore leaves out %s, which the build needs", f)
		}
	}
	if embedded == 0 {
		t.Errorf("no embedded BPF object among the build's files: %v", files)
	}
}
