package main

import (
	"flag"
	"slices"

	"github.com/meshbox/meshbox/appliance"
)

// configFlags are the flags of a command that reads the node's
// configuration: --config and the appliance's config flags.
type configFlags struct {
	fs     *flag.FlagSet
	file   *string
	fields map[string]string // flag name -> config field
}

// addConfigFlags registers --config and the config flags named in only (all
// of them when none are named) on fs.
func addConfigFlags(fs *flag.FlagSet, only ...string) *configFlags {
	c := &configFlags{fs: fs, fields: map[string]string{}}
	c.file = fs.String("config", "", "JSON config file (env MESHBOX_CONFIG)")
	for _, f := range appliance.ConfigFlags {
		if len(only) > 0 && !slices.Contains(only, f.Name) {
			continue
		}
		fs.String(f.Name, "", f.Usage)
		c.fields[f.Name] = f.Field
	}
	return c
}

// load builds the configuration from the parsed flags, the environment and
// envFile ("" for none) with the appliance's one loader.
func (c *configFlags) load(m *Main, envFile string) (appliance.Config, error) {
	given := map[string]string{}
	c.fs.Visit(func(f *flag.Flag) {
		if field, ok := c.fields[f.Name]; ok {
			given[field] = f.Value.String()
		}
	})
	return appliance.LoadConfig(appliance.ConfigSources{File: *c.file, EnvFile: envFile, Getenv: m.Getenv, Flags: given})
}
