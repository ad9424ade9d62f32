package modules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/meshbox/meshbox/internal/names"
)

// ManifestFile is the name of a module's manifest in its folder.
const ManifestFile = "manifest.json"

// Defaults of a manifest's optional fields.
const (
	DefaultStopGrace  = 10 * time.Second
	DefaultStartGrace = 10 * time.Second
)

// Manifest describes one module of the catalog: how each of its selections
// runs, as which user, what it hosts and uses on the node's NATS server,
// and how its overrides and grants reach it. It is read from
// <catalog>/<name>/manifest.json: strict JSON, unknown keys are an error.
//
//	{
//	  "name": "backups",
//	  "selections": {
//	    "stable":  {"command": "bin/backups", "args": ["--quiet"], "env": {"LEVEL": "info"}},
//	    "nightly": {"command": "bin/backups-next"}
//	  },
//	  "user": "backups",
//	  "stop_grace": "20s",
//	  "start_grace": "5s",
//	  "hosts": {"capabilities": ["backups.status"], "stages": ["nightly-backup"]},
//	  "uses": {"capabilities": ["storage.put"], "publishes": ["backups.done"]},
//	  "overrides": {"target": "BACKUP_TARGET"},
//	  "grants": [{"resource": "nas-storage", "env": "STORAGE_CREDENTIAL"}]
//	}
//
// A Manifest is not modified after ReadManifest returned it.
type Manifest struct {
	// Name is the module's name; it must be the folder's name.
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Selections maps each selection an assignment may name to how it runs
	// (at least one).
	Selections map[string]Selection `json:"selections"`
	// User is the system user the module runs as; "" runs it as the node's
	// own user. Another user than the node's needs a node that may switch
	// users (root, or CAP_SETUID and CAP_SETGID).
	User string `json:"user,omitempty"`
	// StopGrace is how long a stopping module has between SIGTERM and
	// SIGKILL (default 10s).
	StopGrace string `json:"stop_grace,omitempty"`
	// StartGrace is how long a started module has to host what it
	// declares before the node flags it (default 10s).
	StartGrace string `json:"start_grace,omitempty"`
	// Hosts is what the module serves on the node's NATS server.
	Hosts Hosts `json:"hosts"`
	// Uses is what the module calls, submits and publishes.
	Uses Uses `json:"uses"`
	// Overrides maps override keys to the environment variable that
	// carries them; an override not named here arrives as
	// MESHBOX_OVERRIDE_<KEY> (see OverrideEnv).
	Overrides map[string]string `json:"overrides,omitempty"`
	// Grants are the grants of this node the module receives as files.
	Grants []GrantRef `json:"grants,omitempty"`

	stopGraceD, startGraceD time.Duration // parsed by validate
}

// Selection is how one selection of a module runs.
type Selection struct {
	// Command is the program: a path relative to the module's folder when
	// it holds a '/', else a name looked up in PATH.
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Dir is the working directory, relative to the module's folder
	// (default: the module's folder).
	Dir string `json:"dir,omitempty"`
	// Env is added to the module's environment; overrides beat it.
	Env map[string]string `json:"env,omitempty"`
}

// Hosts is what a module serves: capabilities (cap.<name>) and stages
// (work.<stage>). The node declares the stages' queues on the broker as
// soon as the module is assigned, and flags what is not served after
// StartGrace.
type Hosts struct {
	Capabilities []string `json:"capabilities,omitempty"`
	Stages       []string `json:"stages,omitempty"`
}

// Uses is what a module calls (capabilities), submits to (stages), and
// publishes and subscribes to (event topics).
type Uses struct {
	Capabilities []string `json:"capabilities,omitempty"`
	Stages       []string `json:"stages,omitempty"`
	Publishes    []string `json:"publishes,omitempty"`
	Subscribes   []string `json:"subscribes,omitempty"`
}

// GrantRef names a grant resource the module receives: every grant of
// this node for Resource is written to a file, whose path is in Env
// (default MESHBOX_GRANT_<RESOURCE>, see GrantEnv).
type GrantRef struct {
	Resource string `json:"resource"`
	Env      string `json:"env,omitempty"`
}

// envName is what an environment variable name may be.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ReadManifest reads and validates the manifest at path. dirName is the
// name of the module's folder, which the manifest's name must equal. Every
// error is a *ManifestError naming path and the field.
func ReadManifest(path, dirName string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ManifestError{File: path, Err: err}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, &ManifestError{File: path, Field: jsonField(err), Err: jsonCause(err)}
	}
	if dec.More() {
		return nil, &ManifestError{File: path, Err: errors.New("more than one JSON value")}
	}
	if err := m.validate(path, dirName); err != nil {
		return nil, err
	}
	return &m, nil
}

// jsonField names the field a decoding error is about, when it says.
func jsonField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return strings.Trim(f, `"`)
	}
	return ""
}

// jsonCause is a decoding error without the field jsonField took out.
func jsonCause(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("must be %s, not %s", te.Type, te.Value)
	}
	if strings.HasPrefix(err.Error(), "json: unknown field ") {
		return errors.New("unknown field")
	}
	return fmt.Errorf("not valid JSON: %w", err)
}

// validate checks every field; the first problem is returned.
func (m *Manifest) validate(path, dirName string) error {
	var errs []error
	bad := func(field string, err error) {
		errs = append(errs, &ManifestError{File: path, Field: field, Err: err})
	}
	switch {
	case m.Name == "":
		bad("name", errors.New("required"))
	case names.Module(m.Name) != nil:
		bad("name", names.Module(m.Name))
	case m.Name != dirName:
		bad("name", fmt.Errorf("%q is not the folder's name %q", m.Name, dirName))
	}
	if len(m.Selections) == 0 {
		bad("selections", errors.New("required: at least one selection"))
	}
	for _, sel := range slices.Sorted(maps.Keys(m.Selections)) {
		s := m.Selections[sel]
		field := "selections." + sel
		if sel == "" || names.Module(sel) != nil {
			bad(field, fmt.Errorf("%q is not a valid selection name (letters, digits, '_', '.', '-')", sel))
		}
		switch {
		case s.Command == "":
			bad(field+".command", errors.New("required"))
		case filepath.IsAbs(s.Dir) || strings.HasPrefix(filepath.Clean(s.Dir), ".."):
			bad(field+".dir", fmt.Errorf("%q must be relative to the module's folder, inside it", s.Dir))
		}
		for _, k := range slices.Sorted(maps.Keys(s.Env)) {
			if !envName.MatchString(k) {
				bad(field+".env", fmt.Errorf("%q is not an environment variable name", k))
			}
		}
	}
	grace := func(field, v string, def time.Duration) time.Duration {
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		switch {
		case err != nil:
			bad(field, fmt.Errorf("%q is not a duration such as \"10s\"", v))
		case d < 0 || d > 10*time.Minute:
			bad(field, fmt.Errorf("%s is out of range 0..10m", d))
		}
		return d
	}
	m.stopGraceD = grace("stop_grace", m.StopGrace, DefaultStopGrace)
	m.startGraceD = grace("start_grace", m.StartGrace, DefaultStartGrace)
	check := func(field string, list []string, rule func(string) error) {
		for i, v := range list {
			if err := rule(v); err != nil {
				bad(fmt.Sprintf("%s[%d]", field, i), err)
			}
		}
	}
	check("hosts.capabilities", m.Hosts.Capabilities, names.Capability)
	check("hosts.stages", m.Hosts.Stages, names.Stage)
	check("uses.capabilities", m.Uses.Capabilities, names.Capability)
	check("uses.stages", m.Uses.Stages, names.Stage)
	check("uses.publishes", m.Uses.Publishes, names.Topic)
	check("uses.subscribes", m.Uses.Subscribes, names.Topic)
	for _, k := range slices.Sorted(maps.Keys(m.Overrides)) {
		if err := names.OverrideKey(k); err != nil {
			bad("overrides", err)
		}
		if !envName.MatchString(m.Overrides[k]) {
			bad("overrides."+k, fmt.Errorf("%q is not an environment variable name", m.Overrides[k]))
		}
	}
	for i, g := range m.Grants {
		if err := names.Resource(g.Resource); err != nil {
			bad(fmt.Sprintf("grants[%d].resource", i), err)
		}
		if g.Env != "" && !envName.MatchString(g.Env) {
			bad(fmt.Sprintf("grants[%d].env", i), fmt.Errorf("%q is not an environment variable name", g.Env))
		}
	}
	if len(errs) > 0 {
		return errs[0] // one clear problem at a time, the first in field order
	}
	return nil
}

// stopGrace is the manifest's stop grace or the default.
func (m *Manifest) stopGrace() time.Duration { return m.stopGraceD }

// startGrace is the manifest's start grace or the default.
func (m *Manifest) startGrace() time.Duration { return m.startGraceD }

// SelectionNames lists the manifest's selections, sorted.
func (m *Manifest) SelectionNames() []string { return slices.Sorted(maps.Keys(m.Selections)) }

// Permissions is what a module may do on the node's NATS server, from its
// manifest: what it hosts and what it uses. It is what a module's own
// local credential allows (Config.Credentials).
type Permissions struct {
	Hosts Hosts
	Uses  Uses
}

// Credential is a module's local NATS credential: the content of an nkey
// seed file and the inbox prefix its permissions allow for replies.
type Credential struct {
	File        []byte
	InboxPrefix string
}

// Permissions returns what the manifest declares.
func (m *Manifest) Permissions() Permissions {
	return Permissions{Hosts: m.Hosts, Uses: m.Uses}
}

// The MESHBOX_* variables the node sets for every module (package doc).
const (
	EnvNode       = "MESHBOX_NODE"
	EnvModule     = "MESHBOX_MODULE"
	EnvSelection  = "MESHBOX_SELECTION"
	EnvRuntimeDir = "MESHBOX_RUNTIME_DIR"
	EnvGrantsDir  = "MESHBOX_GRANTS_DIR"
)

// The prefixes of the variables OverrideEnv and GrantEnv name.
const (
	EnvOverridePrefix = "MESHBOX_OVERRIDE_"
	EnvGrantPrefix    = "MESHBOX_GRANT_"
)

// OverrideEnv is the environment variable an override key reaches a
// module in when its manifest does not map it: MESHBOX_OVERRIDE_ and the
// key in upper case with every '.' and '-' made '_' ("backup.target" →
// MESHBOX_OVERRIDE_BACKUP_TARGET).
func OverrideEnv(key string) string { return EnvOverridePrefix + envToken(key) }

// GrantEnv is the environment variable that names the grant files of a
// resource when the manifest does not name one: MESHBOX_GRANT_ and the
// resource in upper case with every character other than a letter or digit
// made '_'.
func GrantEnv(resource string) string { return EnvGrantPrefix + envToken(resource) }

func envToken(s string) string {
	b := []byte(strings.ToUpper(s))
	for i, c := range b {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}
