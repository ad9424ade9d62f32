package appliance

import (
	"runtime"
	"runtime/debug"
)

// version is set at build time with
// -ldflags "-X github.com/meshbox/meshbox/appliance.version=v1.2.3".
var version = "dev"

// commit is the VCS commit, set at build time with
// -ldflags "-X github.com/meshbox/meshbox/appliance.commit=abc123" for builds
// that do not stamp VCS information (-buildvcs=false, builds outside git).
var commit = ""

// buildDate is when the binary was built (RFC 3339, UTC), set at build time
// with -ldflags "-X github.com/meshbox/meshbox/appliance.buildDate=...". The
// Makefile stamps the commit's time, so a build is reproducible.
var buildDate = ""

// BuildInfo says which build of meshbox this is.
type BuildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Date    string `json:"date,omitempty"` // build date, RFC 3339; empty when not stamped
	Go      string `json:"go"`
	Arch    string `json:"arch"` // GOOS/GOARCH, with the ARM version on 32-bit ARM (linux/arm/v7)
}

// Build returns the version, the VCS commit the binary was built from (when
// the build recorded it), the build date, the Go version and the platform.
func Build() BuildInfo {
	b := BuildInfo{Version: version, Commit: commit, Date: buildDate, Go: runtime.Version(),
		Arch: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.Go = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.modified":
				if s.Value == "true" && b.Commit != "" {
					b.Commit += "-dirty"
				}
			case "vcs.time":
				if b.Date == "" {
					b.Date = s.Value
				}
			case "GOARM":
				if runtime.GOARCH == "arm" {
					b.Arch += "/v" + s.Value
				}
			}
		}
	}
	return b
}
