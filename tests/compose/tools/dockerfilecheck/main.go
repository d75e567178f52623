// dockerfilecheck parses Dockerfiles with BuildKit's own parser and linter (the code that
// `docker build` runs) and reports, as one JSON document, what tests/compose/test_compose.py
// checks: stages and their base images, every COPY/ADD source taken from the build context
// (does it exist, and does the Dockerfile's ignore file let it into the context, with
// Docker's pattern semantics), and the linter's warnings.
//
//	dockerfilecheck -context DIR -file DIR/docker/x/Dockerfile
//
// The ignore file is <Dockerfile>.dockerignore next to the Dockerfile if it exists, else
// <context>/.dockerignore (BuildKit's rule).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/client/llb"
	"github.com/moby/buildkit/client/llb/sourceresolver"
	"github.com/moby/buildkit/frontend/dockerfile/dockerfile2llb"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	digest "github.com/opencontainers/go-digest"
)

type stage struct {
	Name string `json:"name"`
	Base string `json:"base"`
}

type source struct {
	Stage       string `json:"stage"`
	Instruction string `json:"instruction"`
	Source      string `json:"source"`
	Dest        string `json:"dest"`
	Line        int    `json:"line"`
	Exists      bool   `json:"exists"`
	InContext   bool   `json:"in_context"`
}

type warning struct {
	Rule    string `json:"rule"`
	Message string `json:"message"`
	Line    int    `json:"line"`
}

type report struct {
	File       string            `json:"file"`
	IgnoreFile string            `json:"ignore_file"`
	Args       map[string]string `json:"args"`
	Stages     []stage           `json:"stages"`
	Sources    []source          `json:"sources"`
	Warnings   []warning         `json:"warnings"`
	Error      string            `json:"error,omitempty"`
}

func main() {
	contextDir := flag.String("context", ".", "build context directory")
	file := flag.String("file", "Dockerfile", "the Dockerfile")
	flag.Parse()
	rep := check(*contextDir, *file)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
	if rep.Error != "" {
		os.Exit(1)
	}
}

func check(contextDir, file string) (rep report) {
	rep = report{File: file, Args: map[string]string{}, Stages: []stage{}, Sources: []source{}, Warnings: []warning{}}
	f, err := os.Open(file)
	if err != nil {
		rep.Error = err.Error()
		return
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		rep.Error = "parse: " + err.Error()
		return
	}
	for _, w := range res.Warnings {
		l := 0
		if w.Location != nil {
			l = w.Location.Start.Line
		}
		rep.Warnings = append(rep.Warnings, warning{Rule: "parser", Message: w.Short, Line: l})
	}
	stages, metaArgs, err := instructions.Parse(res.AST, linter.New(&linter.Config{SkipAll: true}))
	if err != nil {
		rep.Error = "instructions: " + err.Error()
		return
	}
	dt, err := os.ReadFile(file)
	if err != nil {
		rep.Error = err.Error()
		return
	}
	// The checks of `docker build --check`: every lint rule, every stage, base images
	// answered by a stub (no registry is contacted).
	sourceMap := llb.NewSourceMap(nil, file, "Dockerfile", dt)
	sourceMap.Definition = &llb.Definition{}
	results, err := dockerfile2llb.DockerfileLint(context.Background(), dt, dockerfile2llb.ConvertOpt{
		SourceMap: sourceMap, MetaResolver: stubResolver{}})
	if err != nil {
		rep.Error = "lint: " + err.Error()
		return
	}
	for _, w := range results.Warnings {
		l := 0
		if w.Location != nil && len(w.Location.Ranges) > 0 {
			l = int(w.Location.Ranges[0].Start.Line)
		}
		rep.Warnings = append(rep.Warnings, warning{Rule: w.RuleName, Message: w.Detail, Line: l})
	}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			if kv.Value != nil {
				rep.Args[kv.Key] = *kv.Value
			}
		}
	}
	matcher, ignore, err := ignoreMatcher(contextDir, file)
	if err != nil {
		rep.Error = err.Error()
		return
	}
	rep.IgnoreFile = ignore
	for _, st := range stages {
		rep.Stages = append(rep.Stages, stage{Name: st.Name, Base: expand(st.BaseName, rep.Args)})
		for _, cmd := range st.Commands {
			var sd instructions.SourcesAndDest
			var name string
			var loc []parser.Range
			switch c := cmd.(type) {
			case *instructions.CopyCommand:
				if c.From != "" {
					continue // from another stage or image, not from the context
				}
				sd, name, loc = c.SourcesAndDest, "COPY", c.Location()
			case *instructions.AddCommand:
				sd, name, loc = c.SourcesAndDest, "ADD", c.Location()
			default:
				continue
			}
			for _, src := range sd.SourcePaths {
				exists, inContext := lookup(contextDir, src, matcher)
				rep.Sources = append(rep.Sources, source{Stage: st.Name, Instruction: name, Source: src,
					Dest: sd.DestPath, Line: line(loc), Exists: exists, InContext: inContext})
			}
		}
	}
	return
}

func line(loc []parser.Range) int {
	if len(loc) == 0 {
		return 0
	}
	return loc[0].Start.Line
}

func expand(s string, args map[string]string) string {
	return os.Expand(s, func(k string) string { return args[k] })
}

func ignoreMatcher(contextDir, file string) (*patternmatcher.PatternMatcher, string, error) {
	candidates := []string{file + ".dockerignore", filepath.Join(contextDir, ".dockerignore")}
	for _, path := range candidates {
		f, err := os.Open(path)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, "", err
		}
		defer f.Close()
		patterns, err := ignorefile.ReadAll(f)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		pm, err := patternmatcher.New(patterns)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		return pm, path, nil
	}
	return nil, "", nil
}

// lookup: does the source exist in the context directory, and is at least one matching
// file or directory sent to the builder (not excluded by the ignore file)?
func lookup(contextDir, src string, pm *patternmatcher.PatternMatcher) (exists, inContext bool) {
	rel := filepath.Clean(strings.TrimPrefix(src, "/"))
	matches, _ := filepath.Glob(filepath.Join(contextDir, rel))
	for _, m := range matches {
		exists = true
		r, err := filepath.Rel(contextDir, m)
		if err != nil {
			continue
		}
		if pm == nil {
			inContext = true
			continue
		}
		excluded, err := pm.MatchesOrParentMatches(filepath.ToSlash(r))
		if err == nil && !excluded {
			inContext = true
		}
	}
	return
}

// stubResolver answers every base image with an empty linux/amd64 image configuration.
type stubResolver struct{}

func (stubResolver) ResolveImageConfig(ctx context.Context, ref string, opt sourceresolver.Opt) (string, digest.Digest, []byte, error) {
	cfg := []byte(`{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},"rootfs":{"type":"layers","diff_ids":[]}}`)
	return ref, digest.FromBytes(cfg), cfg, nil
}
