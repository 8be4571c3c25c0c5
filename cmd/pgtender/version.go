package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=...". Left
// at "dev", a build by `go install module@vX.Y.Z` reports the module's
// version instead.
var version = "dev"

// commit is set at build time with -ldflags "-X main.commit=..." where the
// build has no VCS stamp (a container build from a tree without .git, or
// -buildvcs=false); the stamp Go writes from the checkout wins when there
// is one (https://pkg.go.dev/runtime/debug#BuildSetting, vcs.revision).
var commit = ""

// buildVersion is what the binary knows about its own build.
type buildVersion struct {
	Version  string // release version, or "dev"
	Commit   string // VCS revision, or "unknown"
	Modified bool   // the work tree had uncommitted changes
	Go       string // the Go toolchain, runtime.Version()
	Platform string // GOOS/GOARCH
}

// readBuildVersion combines the -X variables with the build information
// the Go toolchain embeds.
func readBuildVersion() buildVersion {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return makeBuildVersion(version, commit, info)
}

// makeBuildVersion is readBuildVersion without the globals (info may be
// nil), for the tests.
func makeBuildVersion(version, commit string, info *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: version, Commit: commit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if info != nil {
		if v.Version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v.Version = info.Main.Version
		}
		for _, setting := range info.Settings {
			switch setting.Key {
			case "vcs.revision":
				v.Commit = setting.Value
			case "vcs.modified":
				v.Modified = setting.Value == "true"
			}
		}
	}
	if v.Commit == "" {
		v.Commit = "unknown"
	}
	return v
}

// String is the --version line: "pgtender 1.2.0 commit 0123abc… go1.26.8
// linux/amd64", with "(modified)" after the commit when the tree had
// changes. One line, so that a log collector or a script can take it whole.
func (v buildVersion) String() string {
	modified := ""
	if v.Modified {
		modified = " (modified)"
	}
	return fmt.Sprintf("pgtender %s commit %s%s %s %s", v.Version, v.Commit, modified, v.Go, v.Platform)
}
