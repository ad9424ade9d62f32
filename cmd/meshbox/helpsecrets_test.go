package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/appliance"
)

// secretEnv sets every MESHBOX_* variable meshbox knows to a value that
// holds a secret of its own: URLs with a password where the variable is a
// URL, a token elsewhere. It returns the environment and the secrets.
func secretEnv() (map[string]string, []string) {
	env := map[string]string{}
	var secrets []string
	for _, name := range appliance.KnownEnvVars() {
		s := "Sekrit" + strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, "MESHBOX_"), "_", ""))
		secrets = append(secrets, s)
		switch name {
		case "MESHBOX_DB":
			env[name] = "postgres://mesh:" + s + "@127.0.0.1:1/mesh"
		case "MESHBOX_BROKER":
			env[name] = "amqp://node:" + s + "@127.0.0.1:1/"
		case "MESHBOX_BROKER_ADMIN":
			env[name] = "http://admin:" + s + "@127.0.0.1:1"
		case "MESHBOX_SERVER":
			env[name] = "nats://prog:" + s + "@127.0.0.1:1"
		default:
			env[name] = "tok-" + s
		}
	}
	return env, secrets
}

// commandLines are every command and subcommand meshbox has, from its
// own tables: the command table, each command's subcommands, and mesh's
// table of commands.
func commandLines(m *Main) [][]string {
	var out [][]string
	for _, c := range commands() {
		out = append(out, []string{c.name})
		c.leaves(func(sub []string) {
			out = append(out, append([]string{c.name}, sub...))
		})
	}
	return out
}

// TestNoSecretInHelpOrUsage: with a password or a token in every variable
// meshbox reads, no command's help (-h, meshbox help ...) and no usage
// error (an unknown flag) shows one.
func TestNoSecretInHelpOrUsage(t *testing.T) {
	env, secrets := secretEnv()
	c := cli{env: env}
	lines := commandLines(&Main{Getenv: func(k string) string { return env[k] }})
	if !slices.ContainsFunc(lines, func(l []string) bool { return strings.Join(l, " ") == "mesh node set-stages" }) {
		t.Fatalf("the command lines lack mesh node set-stages: %v", lines)
	}
	for _, line := range lines {
		if line[0] == "completion" && len(line) > 1 {
			continue // prints a script, no flags
		}
		for _, args := range [][]string{
			append(slices.Clone(line), "-h"),
			append([]string{"help"}, line...),
			append(slices.Clone(line), "--no-such-flag"),
		} {
			out, errOut, err := c.run(t, args...)
			msg := ""
			if err != nil {
				msg = err.Error()
			}
			for _, s := range secrets {
				for what, text := range map[string]string{"stdout": out, "stderr": errOut, "error": msg} {
					if strings.Contains(text, s) {
						t.Errorf("meshbox %s: its %s shows the secret %s:\n%s", strings.Join(args, " "), what, s, text)
					}
				}
			}
		}
	}
	// The help says where a default comes from instead.
	out, errOut, _ := c.run(t, "mesh", "node", "set-stages", "-h")
	if help := out + errOut; !strings.Contains(help, `"$MESHBOX_DB"`) || !strings.Contains(help, `"$MESHBOX_BROKER_ADMIN"`) {
		t.Errorf("mesh node set-stages -h: got\n%s\nwant the defaults named $MESHBOX_DB and $MESHBOX_BROKER_ADMIN", help)
	}
}
