package appliance

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
)

// ConfigSources are the layers LoadConfig puts over DefaultConfig, applied
// in the order of the fields.
type ConfigSources struct {
	// File is the JSON config file; empty: the one MESHBOX_CONFIG names (in
	// EnvFile or the environment), else none.
	File string
	// EnvFile holds MESHBOX_* variables as KEY=VALUE lines (the
	// EnvironmentFile of the systemd unit); applied before the environment.
	EnvFile string
	// Getenv reads the environment; nil: none.
	Getenv func(string) string
	// Flags maps config fields to the values of the flags given on the
	// command line (only those given).
	Flags map[string]string
}

// LoadConfig builds the configuration once, the same way for every command:
// DefaultConfig, then the config file, then the environment file, then the
// environment, then the flags; and validates the result.
func LoadConfig(src ConfigSources) (Config, error) {
	cfg := DefaultConfig()
	getenv := src.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var fileEnv map[string]string
	if src.EnvFile != "" {
		var err error
		if fileEnv, err = ReadEnvFile(src.EnvFile); err != nil {
			return cfg, err
		}
	}
	file := src.File
	if file == "" {
		file = getenv("MESHBOX_CONFIG")
	}
	if file == "" {
		file = fileEnv["MESHBOX_CONFIG"]
	}
	if file != "" {
		if err := cfg.LoadFile(file); err != nil {
			return cfg, err
		}
	}
	if fileEnv != nil {
		if err := cfg.ApplyEnv(func(k string) string { return fileEnv[k] }); err != nil {
			return cfg, fmt.Errorf("%s: %w", src.EnvFile, err)
		}
	}
	if err := cfg.ApplyEnv(getenv); err != nil {
		return cfg, err
	}
	for _, f := range ConfigFlags { // in a fixed order: the first error is the same every time
		if v, ok := src.Flags[f.Field]; ok {
			if err := cfg.Set(f.Field, v); err != nil {
				return cfg, fmt.Errorf("--%s: %w", f.Name, err)
			}
		}
	}
	for field := range src.Flags {
		if !knownFlagField(field) {
			return cfg, fmt.Errorf("unknown config field %q", field)
		}
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// SettingSources names the ways to set the config field (a field path
// Set takes), for a message that tells an operator where to fix it:
// "broker (config key broker, flag --broker, env MESHBOX_BROKER)".
func SettingSources(field string) string {
	ways := []string{"config key " + field}
	for _, f := range ConfigFlags {
		if f.Field == field {
			ways = append(ways, "flag --"+f.Name)
		}
	}
	for _, v := range EnvVars {
		if v.Field == field {
			ways = append(ways, "env "+v.Name)
		}
	}
	return field + " (" + strings.Join(ways, ", ") + ")"
}

func knownFlagField(field string) bool {
	for _, f := range ConfigFlags {
		if f.Field == field {
			return true
		}
	}
	return false
}

// ReadEnvFile reads KEY=VALUE lines: the subset of systemd's
// EnvironmentFile syntax that meshbox.env uses (comments, blank lines,
// "export ", optional quotes).
func ReadEnvFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("env file: %w", err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		line = strings.TrimPrefix(line, "export ")
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("env file %s: line %d: not KEY=VALUE", path, n)
		}
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("env file %s: %w", path, err)
	}
	return env, nil
}

// LoopbackAddr reports whether a listen address host:port is on loopback
// only ("localhost" or a loopback IP; not an unspecified host).
func LoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
