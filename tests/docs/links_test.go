// Package docs checks the manual's pages against the repository: every
// relative link in README.md, docs/ and perf/README.md names a file that
// exists, and every #anchor a heading of that file.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/tests/testenv"
)

var (
	markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading      = regexp.MustCompile(`(?m)^#+ (.*)$`)
	notInAnchor  = regexp.MustCompile(`[^a-z0-9 -]`)
)

// anchorOf is the anchor GitHub gives a heading.
func anchorOf(title string) string {
	return strings.ReplaceAll(notInAnchor.ReplaceAllString(strings.ToLower(title), ""), " ", "-")
}

func TestRelativeLinksResolve(t *testing.T) {
	root := testenv.RepoRoot(t)
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "perf", "README.md"))
	if len(pages) < 4 {
		t.Fatalf("found only %d pages under %s", len(pages), root)
	}
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, page)
		for _, m := range markdownLink.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			file := page
			if path != "" {
				file = filepath.Join(filepath.Dir(page), path)
			}
			body, err := os.ReadFile(file)
			if err != nil {
				if _, statErr := os.Stat(file); statErr != nil {
					t.Errorf("%s: link %s: %v", rel, target, statErr)
				}
				continue // a directory
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			found := false
			for _, h := range heading.FindAllStringSubmatch(string(body), -1) {
				if anchorOf(h[1]) == anchor {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: link %s: no heading with that anchor", rel, target)
			}
		}
	}
}

func TestAnchorOf(t *testing.T) {
	for title, want := range map[string]string{
		"What it costs":                           "what-it-costs",
		"Under a SYN flood, beside kube-proxy":    "under-a-syn-flood-beside-kube-proxy",
		"Datapath cost per packet (`make bench`)": "datapath-cost-per-packet-make-bench",
	} {
		if got := anchorOf(title); got != want {
			t.Errorf("anchorOf(%q) = %q, want %q", title, got, want)
		}
	}
}
