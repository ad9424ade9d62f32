package appliance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/meshbox/meshbox/appliance/modules"
	"github.com/meshbox/meshbox/internal/suggest"
)

// This file says which MESHBOX_* variables meshbox knows: the settings
// (EnvVars), the command line's own (CommandEnvVars) and those the node
// sets for its modules. A variable it does not know is most likely a
// misspelt one (MESHBOX_NAT for MESHBOX_NATS) that would otherwise be
// ignored without a word: UnknownEnvVars finds them, each with the known
// name nearest to it, for `meshbox run` to warn about at start and for
// `meshbox doctor`.

// CommandEnvVars are the MESHBOX_* variables the command line reads that
// are not settings of the node (EnvVars are those).
var CommandEnvVars = []string{
	"MESHBOX_CONFIG",             // the JSON config file (LoadConfig)
	"MESHBOX_SERVER",             // the NATS URL of the node a client command talks to
	"MESHBOX_CREDS",              // the credential file a client command presents
	"MESHBOX_BROKER_ADMIN",       // the broker's management API with the admin credential (meshbox init, mesh)
	"MESHBOX_KIT",                // the mesh's recovery kit file (meshbox mesh node add)
	"MESHBOX_TEST_TAMPER_CHUNKS", // a test hook of meshbox blob get
}

// moduleEnvVars are the variables the node sets for its modules; a
// module that runs meshbox has them.
var moduleEnvVars = []string{modules.EnvNode, modules.EnvModule, modules.EnvSelection, modules.EnvRuntimeDir, modules.EnvGrantsDir}

// moduleEnvPrefixes begin the variables named after a key or a resource
// (modules.OverrideEnv, modules.GrantEnv).
var moduleEnvPrefixes = []string{modules.EnvOverridePrefix, modules.EnvGrantPrefix}

// KnownEnvVars returns every MESHBOX_* variable meshbox knows by name:
// the settings first, then the command line's, then the modules'.
func KnownEnvVars() []string {
	var out []string
	for _, v := range EnvVars {
		out = append(out, v.Name)
	}
	out = append(out, CommandEnvVars...)
	for _, n := range moduleEnvVars {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// KnownEnvVar reports whether meshbox knows the variable name.
func KnownEnvVar(name string) bool {
	if slices.Contains(KnownEnvVars(), name) {
		return true
	}
	for _, p := range moduleEnvPrefixes {
		if strings.HasPrefix(name, p) && len(name) > len(p) {
			return true
		}
	}
	return false
}

// UnknownEnv is a MESHBOX_* variable meshbox does not know.
type UnknownEnv struct {
	Name string `json:"name"`
	// In says where it is set: "the environment" or an env file's path.
	In string `json:"in"`
	// Nearest is the known name nearest to it, "" when none is near.
	Nearest string `json:"nearest,omitempty"`
}

// String says what is wrong with u, and the name meant, in one line.
func (u UnknownEnv) String() string {
	s := fmt.Sprintf("unknown variable %s in %s is ignored", u.Name, u.In)
	if u.Nearest != "" {
		s += "; did you mean " + u.Nearest + "?"
	}
	return s
}

// envPrefix begins the name of every variable meshbox reads.
const envPrefix = "MESHBOX_"

// UnknownEnvVars returns the MESHBOX_* variables set in the env file
// envFile ("" for none) and in environ (KEY=VALUE, as os.Environ returns
// it) that meshbox does not know: those of the file first, each part in
// the order of the names.
func UnknownEnvVars(envFile string, environ []string) ([]UnknownEnv, error) {
	var out []UnknownEnv
	if envFile != "" {
		vars, err := ReadEnvFile(envFile)
		if err != nil {
			return nil, err
		}
		for _, name := range sortedKeys(vars) {
			if u, ok := unknownEnv(name, envFile); ok {
				out = append(out, u)
			}
		}
	}
	var names []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		if u, ok := unknownEnv(name, "the environment"); ok {
			out = append(out, u)
		}
	}
	return out, nil
}

// unknownEnv is name's UnknownEnv, if it is a MESHBOX_* name meshbox
// does not know.
func unknownEnv(name, in string) (UnknownEnv, bool) {
	if !strings.HasPrefix(name, envPrefix) || KnownEnvVar(name) {
		return UnknownEnv{}, false
	}
	near, _ := suggest.Nearest(name, KnownEnvVars())
	return UnknownEnv{Name: name, In: in, Nearest: near}, true
}
