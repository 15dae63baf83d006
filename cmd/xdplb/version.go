package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// VersionInfo is the answer of `xdplb version`.
type VersionInfo struct {
	Version    string       `json:"version"`
	Go         string       `json:"go"`
	Platform   string       `json:"platform"`
	Commit     string       `json:"commit,omitempty"`
	CommitTime string       `json:"commitTime,omitempty"`
	Modified   bool         `json:"modified,omitempty"`
	Schema     string       `json:"schema"`
	Programs   []ProgramRef `json:"programs"`
}

// ProgramRef is one BPF program embedded in the binary. Digest is a hash
// of its instructions: two builds with the same digests carry the same
// datapath.
type ProgramRef struct {
	Name         string `json:"name"`
	Type         string `json:"type"`
	Instructions int    `json:"instructions"`
	Digest       string `json:"digest"`
}

func versionInfo() (VersionInfo, error) {
	v := VersionInfo{
		Version:  version,
		Go:       runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH,
		Schema:   loader.SchemaVersion,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitTime = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	for _, load := range xdp.DatapathObjects() {
		spec, err := load()
		if err != nil {
			return v, fmt.Errorf("read embedded BPF object: %w", err)
		}
		for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
			p := spec.Programs[name]
			h := sha256.New()
			if err := p.Instructions.Marshal(h, binary.LittleEndian); err != nil {
				return v, fmt.Errorf("program %s: %w", name, err)
			}
			v.Programs = append(v.Programs, ProgramRef{
				Name: name, Type: p.Type.String(), Instructions: len(p.Instructions),
				Digest: hex.EncodeToString(h.Sum(nil))[:16],
			})
		}
	}
	return v, nil
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the version of xdplb, the Go toolchain and the embedded BPF programs",
		Flags: []cli.Flag{outputFlag()},
		Action: func(c *cli.Context) error {
			asJSON, err := outputJSON(c)
			if err != nil {
				return err
			}
			if err := noArgs(c); err != nil {
				return err
			}
			v, err := versionInfo()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.App.Writer, v)
			}
			w := c.App.Writer
			fmt.Fprintf(w, "xdplb %s\n", v.Version)
			fmt.Fprintf(w, "go:       %s %s\n", v.Go, v.Platform)
			if v.Commit != "" {
				extra := []string{}
				if v.CommitTime != "" {
					extra = append(extra, v.CommitTime)
				}
				if v.Modified {
					extra = append(extra, "modified")
				}
				fmt.Fprintf(w, "commit:   %s", v.Commit)
				if len(extra) > 0 {
					fmt.Fprintf(w, " (%s)", strings.Join(extra, ", "))
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "schema:   %s (pins under <bpffs-root>/xdplb/%s)\n", v.Schema, v.Schema)
			for i, p := range v.Programs {
				label := "bpf:"
				if i > 0 {
					label = ""
				}
				fmt.Fprintf(w, "%-9s %s (%s, %d instructions, digest %s)\n", label, p.Name, p.Type, p.Instructions, p.Digest)
			}
			return nil
		},
	}
}
