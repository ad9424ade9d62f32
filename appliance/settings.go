package appliance

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/meshbox/meshbox/bridge"
)

// This file is the one definition of the node's settings. A setting's
// name, type and default are its field: the json tag of the field in
// Config (or in a component's own options struct that Config holds, such
// as bridge.Config) is its key in the config file, the field's type is
// its type, DefaultConfig holds its default, and Validate checks it. The
// few settings that also come from the environment and the command line
// add their variable, flag and help line in envSettings below. Everything
// else is read from these once: the config file's form (fileForm), Set,
// EnvVars, ConfigFlags, the reference table of docs/configuration.md
// (SettingsTable), the man page and the unknown-variable warnings.

// envSettings are the settings that the environment, an env file and
// flags also set, in the order a command's help and the docs list them.
var envSettings = []envSetting{
	{field: func(c *Config) any { return &c.Node }, env: "MESHBOX_NODE", flag: "node", arg: "NAME",
		usage: "this node's mesh name", usageDefault: "default: the host name",
		docDefault: "the host name (first label)"},
	{field: func(c *Config) any { return &c.DataDir }, env: "MESHBOX_DATA", flag: "data", arg: "DIR",
		usage: "data directory", usageDefault: "default " + DefaultDataDir(),
		docDefault: "`/var/lib/meshbox` for root, else `~/.local/share/meshbox`"},
	{field: func(c *Config) any { return &c.NATS }, env: "MESHBOX_NATS", flag: "nats", arg: "HOST:PORT",
		usage: "NATS listen address host:port, port 0 = any free", usageDefault: "default " + DefaultNATS,
		docDefault: "`" + DefaultNATS + "` (port 0: any free port)"},
	{field: func(c *Config) any { return &c.NATSWebSocket }, env: "MESHBOX_NATS_WEBSOCKET", flag: "nats-websocket", arg: "HOST:PORT",
		usage:        "WebSocket listen address host:port for browser clients (nats.ws), port 0 = any free; loopback unless nats_websocket_cert and _key are set",
		usageDefault: "default: none",
		docDefault:   "none: no WebSocket listener (port 0: any free port; loopback unless it has TLS; see [Browsers and WebSocket](websocket.md))"},
	{field: func(c *Config) any { return &c.NATSMQTT }, env: "MESHBOX_NATS_MQTT", flag: "nats-mqtt", arg: "HOST:PORT",
		usage: "MQTT listen address host:port for devices, port 0 = any free", usageDefault: "default: none",
		docDefault: "none: no MQTT listener (port 0: any free port; see [Devices and MQTT](mqtt.md))"},
	{field: func(c *Config) any { return &c.HTTP }, env: "MESHBOX_HTTP", flag: "http", arg: "HOST:PORT",
		usage: "HTTP listen address host:port, port 0 = any free, or off", usageDefault: "default " + DefaultHTTP,
		docDefault: "`" + DefaultHTTP + "` (port 0: any free port; `off`)"},
	{field: func(c *Config) any { return &c.Pprof }, env: "MESHBOX_PPROF", flag: "pprof", arg: "true",
		usage: "serve /debug/pprof/ on the HTTP listener, which must be loopback: true or false", usageDefault: "default false",
		docDefault: "`false`: serve Go's profiles at `/debug/pprof/` (loopback listener only)"},
	{field: func(c *Config) any { return &c.DB }, env: "MESHBOX_DB", flag: "db", arg: "URL",
		usage: "mesh database URL postgres://...", usageDefault: "default: none, standalone",
		docDefault: "none: standalone"},
	{field: func(c *Config) any { return &c.Broker }, env: "MESHBOX_BROKER", flag: "broker", arg: "URL",
		usage:      "broker URL amqp(s)://..., overrides the broker.url setting",
		docDefault: "the `broker.url` mesh setting (several brokers: URLs separated by commas)"},
	{field: func(c *Config) any { return &c.Log.Level }, env: "MESHBOX_LOG_LEVEL", flag: "log-level", arg: "L",
		usage: "debug, info, warn or error", docDefault: "`info`"},
	{field: func(c *Config) any { return &c.Log.Format }, env: "MESHBOX_LOG_FORMAT", flag: "log-format", arg: "F",
		usage: "text or json", docDefault: "`text` (`json`)"},
	{field: func(c *Config) any { return &c.Modules.Dir }, env: "MESHBOX_MODULES_DIR", flag: "modules-dir", arg: "DIR",
		usage:        "module catalog directory",
		usageDefault: "default: /etc/meshbox/modules with the data directory /var/lib/meshbox, else modules in the data directory",
		docDefault:   "the module catalog: `/etc/meshbox/modules` with the data directory `/var/lib/meshbox`, else `modules` in the data directory"},
	{field: func(c *Config) any { return &c.Modules.RunDir }, env: "MESHBOX_MODULES_RUN_DIR",
		docDefault: "`run` in the data directory: the modules' runtime directories"},
	{field: func(c *Config) any { return &c.Blobs.Enabled }, env: "MESHBOX_BLOBS",
		docDefault: "`true`: the blob store and JetStream (`false`: neither)"},
	{field: func(c *Config) any { return &c.NATSAnonymous }, env: "MESHBOX_NATS_ANONYMOUS",
		docDefault: "`false`: in a mesh, programs need a credential (`true`: anyone on the machine gets in, with a warning)"},
}

// envSetting is what a setting that also comes from the environment adds
// to its field.
type envSetting struct {
	field func(c *Config) any // the address of the setting's field in c
	env   string              // its environment variable
	flag  string              // its flag, without dashes; "" for none
	arg   string              // the flag's argument in the docs' table
	// usage and usageDefault make the flag's help line:
	// "usage (env VAR; usageDefault)".
	usage, usageDefault string
	// docDefault is the default column of the docs' table (markdown).
	docDefault string
}

// flagUsage is the help line of s's flag.
func (s envSetting) flagUsage() string {
	if s.usageDefault == "" {
		return fmt.Sprintf("%s (env %s)", s.usage, s.env)
	}
	return fmt.Sprintf("%s (env %s; %s)", s.usage, s.env, s.usageDefault)
}

// EnvVars maps each environment variable to the config field it sets.
var EnvVars = func() []struct{ Name, Field string } {
	out := make([]struct{ Name, Field string }, 0, len(envSettings))
	for _, s := range envSettings {
		out = append(out, struct{ Name, Field string }{s.env, SettingKey(s.field)})
	}
	return out
}()

// ConfigFlags are the flags that set the node's configuration, in the order
// a command's help lists them. Every command that needs the configuration
// registers these (or some of them) and hands what was given to LoadConfig.
var ConfigFlags = func() []ConfigFlag {
	var out []ConfigFlag
	for _, s := range envSettings {
		if s.flag != "" {
			out = append(out, ConfigFlag{Name: s.flag, Field: SettingKey(s.field), Usage: s.flagUsage()})
		}
	}
	return out
}()

// ConfigFlag is a command-line flag that sets one config field. Its
// environment variable is the one EnvVars names for the same field.
type ConfigFlag struct {
	Name  string // the flag, without dashes
	Field string // the config field path Set takes
	Usage string
}

// SettingsTable is the reference table of docs/configuration.md, in
// markdown: each setting that the environment sets, its flag and its
// default.
func SettingsTable() string {
	var b strings.Builder
	b.WriteString("| flag | environment | default |\n|---|---|---|\n")
	for _, s := range envSettings {
		flag := "| |"
		if s.flag != "" {
			flag = "| `--" + s.flag + " " + s.arg + "` |"
		}
		fmt.Fprintf(&b, "%s `%s` | %s |\n", flag, s.env, s.docDefault)
	}
	return b.String()
}

// SettingKey is the config path ("cache.keep") of the field
// whose address field returns: for a message that names a setting
// without spelling it again.
func SettingKey(field func(c *Config) any) string {
	var c Config
	return c.key(field(&c))
}

// key is the config path of the setting at address p, a field of c.
func (c *Config) key(p any) string {
	want := reflect.ValueOf(p)
	root := reflect.ValueOf(c).Elem()
	for _, s := range settingFields() {
		f := root.FieldByIndex(s.index).Addr()
		if f.Type() == want.Type() && f.Pointer() == want.Pointer() {
			return s.key
		}
	}
	panic(fmt.Sprintf("appliance: %T is not the address of a setting of the Config", p))
}

// Set sets one setting by its config path (a key of SettingKey's) from
// text: a string as it is, a boolean as strconv.ParseBool reads it, a
// number, a duration in Go's notation.
func (c *Config) Set(field, value string) error {
	s, ok := findSetting(field)
	if !ok {
		return fmt.Errorf("unknown config field %q", field)
	}
	v := reflect.ValueOf(c).Elem().FieldByIndex(s.index)
	switch {
	case v.Kind() == reflect.String:
		v.SetString(value)
	case v.Kind() == reflect.Bool:
		on, err := strconv.ParseBool(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not true or false", field, value)
		}
		v.SetBool(on)
	case v.Type() == reflect.TypeFor[time.Duration]() || v.Type() == durationType:
		d, err := time.ParseDuration(value)
		if err != nil {
			return fmt.Errorf("%s: %q is not a duration such as 5s", field, value)
		}
		v.SetInt(int64(d))
	case v.CanInt():
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || v.OverflowInt(n) {
			return fmt.Errorf("%s: %q is not a whole number", field, value)
		}
		v.SetInt(n)
	default:
		return fmt.Errorf("config field %q is not set from text", field)
	}
	return nil
}

// ApplyEnv sets fields from the MESHBOX_* variables that getenv returns
// non-empty.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	for _, v := range EnvVars {
		if val := getenv(v.Name); val != "" {
			if err := c.Set(v.Field, val); err != nil {
				return fmt.Errorf("%s: %w", v.Name, err)
			}
		}
	}
	return nil
}

// settingField is one setting as the struct tags define it.
type settingField struct {
	key   string // the config path, "cache.keep"
	index []int  // the field's index path in Config
	form  []int  // the field's index path in the config file's form
}

// settingFields are the settings, in the order of Config's fields.
func settingFields() []settingField { return settingsOfConfig().fields }

// formType is the config file's form of Config: a struct of the same
// json keys, whose durations are Durations (Go strings such as "5s") and
// whose bridge policies are DedupeConfig and RetryConfig.
func formType() reflect.Type { return settingsOfConfig().form }

// settingsOfConfig reads the settings and the file's form from the tags,
// once.
var settingsOfConfig = sync.OnceValue(func() (def struct {
	fields []settingField
	form   reflect.Type
}) {
	var walk func(t reflect.Type, prefix string, index, formIndex []int) reflect.Type
	walk = func(t reflect.Type, prefix string, index, formIndex []int) reflect.Type {
		var out []reflect.StructField
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "" || name == "-" {
				continue // not a setting: a bridge.Config field the appliance fills in
			}
			idx := append(slices.Clone(index), i)
			fidx := append(slices.Clone(formIndex), len(out))
			ft := fileType(f.Type)
			if f.Type.Kind() == reflect.Struct && ft == f.Type {
				ft = walk(f.Type, prefix+name+".", idx, fidx) // a part: log, cache, bridge, ...
			} else {
				def.fields = append(def.fields, settingField{key: prefix + name, index: idx, form: fidx})
			}
			out = append(out, reflect.StructField{
				Name: fmt.Sprintf("F%d", len(out)),
				Type: ft,
				Tag:  reflect.StructTag(`json:"` + name + `"`),
			})
		}
		return reflect.StructOf(out)
	}
	def.form = walk(reflect.TypeFor[Config](), "", nil, nil)
	return def
})

// MarshalJSON writes c as a config file holds it.
func (c Config) MarshalJSON() ([]byte, error) { return json.Marshal(c.fileForm().Interface()) }

// UnmarshalJSON reads a config file's JSON over c, as LoadFile does.
func (c *Config) UnmarshalJSON(data []byte) error { return c.decodeFile(data, nil) }

// decodeFile reads the JSON data over c. Unknown keys are an error. On
// an error, at is set to the decoder's offset when it stopped.
func (c *Config) decodeFile(data []byte, at *int64) error {
	form := c.fileForm()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(form.Interface()); err != nil {
		if at != nil {
			*at = dec.InputOffset()
		}
		return err
	}
	if dec.More() {
		return errMoreThanOneValue
	}
	c.fromFileForm(form)
	return nil
}

func findSetting(key string) (settingField, bool) {
	for _, s := range settingFields() {
		if s.key == key {
			return s, true
		}
	}
	return settingField{}, false
}

// fileType is the config file's form of a setting's type t.
func fileType(t reflect.Type) reflect.Type {
	switch t {
	case reflect.TypeFor[time.Duration]():
		return durationType
	case reflect.TypeFor[map[string]bridge.DedupePolicy]():
		return reflect.TypeFor[map[string]DedupeConfig]()
	case reflect.TypeFor[map[string]bridge.RetryPolicy]():
		return reflect.TypeFor[map[string]RetryConfig]()
	}
	return t
}

// fileForm returns c in the config file's form (a pointer to a formType).
func (c *Config) fileForm() reflect.Value {
	form := reflect.New(formType())
	root := reflect.ValueOf(c).Elem()
	for _, s := range settingFields() {
		form.Elem().FieldByIndex(s.form).Set(toFile(root.FieldByIndex(s.index)))
	}
	return form
}

// fromFileForm sets c from form, a pointer to a formType.
func (c *Config) fromFileForm(form reflect.Value) {
	root := reflect.ValueOf(c).Elem()
	for _, s := range settingFields() {
		f := root.FieldByIndex(s.index)
		f.Set(fromFile(form.Elem().FieldByIndex(s.form), f.Type()))
	}
}

// toFile converts a setting's value v to its file form.
func toFile(v reflect.Value) reflect.Value {
	switch m := v.Interface().(type) {
	case map[string]bridge.DedupePolicy:
		if m == nil {
			return reflect.Zero(reflect.TypeFor[map[string]DedupeConfig]())
		}
		out := make(map[string]DedupeConfig, len(m))
		for stage, p := range m {
			out[stage] = DedupeConfig{Window: Duration(p.Window), MaxEntries: p.MaxEntries}
		}
		return reflect.ValueOf(out)
	case map[string]bridge.RetryPolicy:
		if m == nil {
			return reflect.Zero(reflect.TypeFor[map[string]RetryConfig]())
		}
		out := make(map[string]RetryConfig, len(m))
		for stage, p := range m {
			out[stage] = RetryConfig{Attempts: p.Attempts, Backoff: Duration(p.Backoff), MaxBackoff: Duration(p.MaxBackoff)}
		}
		return reflect.ValueOf(out)
	}
	return v.Convert(fileType(v.Type()))
}

// fromFile converts v, a setting's file form, to the setting's type t.
func fromFile(v reflect.Value, t reflect.Type) reflect.Value {
	switch m := v.Interface().(type) {
	case map[string]DedupeConfig:
		if m == nil {
			return reflect.Zero(t)
		}
		out := make(map[string]bridge.DedupePolicy, len(m))
		for stage, d := range m {
			out[stage] = bridge.DedupePolicy{Window: d.Window.D(), MaxEntries: d.MaxEntries}
		}
		return reflect.ValueOf(out)
	case map[string]RetryConfig:
		if m == nil {
			return reflect.Zero(t)
		}
		out := make(map[string]bridge.RetryPolicy, len(m))
		for stage, r := range m {
			out[stage] = bridge.RetryPolicy{Attempts: r.Attempts, Backoff: r.Backoff.D(), MaxBackoff: r.MaxBackoff.D()}
		}
		return reflect.ValueOf(out)
	}
	return v.Convert(t)
}

// DedupeConfig is a stage's bridge.DedupePolicy in the config file.
type DedupeConfig struct {
	Window     Duration `json:"window"`      // how long a completed id is remembered (1s..90 days)
	MaxEntries int      `json:"max_entries"` // the most ids remembered for the stage (1..10,000,000)
}

// RetryConfig is a stage's bridge.RetryPolicy in the config file.
type RetryConfig struct {
	Attempts int      `json:"attempts"` // attempts in all (1..1000)
	Backoff  Duration `json:"backoff"`  // wait before the second attempt (10ms..7 days)
	// MaxBackoff, when above backoff, doubles the wait after each failed
	// attempt up to it; unset, every wait is backoff.
	MaxBackoff Duration `json:"max_backoff"`
}
