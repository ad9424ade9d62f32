package appliance

import "runtime/debug"

// version is set at build time with
// -ldflags "-X github.com/meshbox/meshbox/appliance.version=v1.2.3".
var version = "dev"

// commit is the VCS commit, set at build time with
// -ldflags "-X github.com/meshbox/meshbox/appliance.commit=abc123" for builds
// that do not stamp VCS information (-buildvcs=false, builds outside git).
var commit = ""

// BuildInfo says which build of meshbox this is.
type BuildInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Go      string `json:"go"`
}

// Build returns the version, the VCS commit the binary was built from (when
// the build recorded it) and the Go version.
func Build() BuildInfo {
	b := BuildInfo{Version: version, Commit: commit}
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
			}
		}
	}
	return b
}
