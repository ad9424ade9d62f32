package doctor

import (
	"context"
	"strings"

	"github.com/meshbox/meshbox/appliance"
)

// checkVariables names the MESHBOX_* variables of the env file and of the
// environment that meshbox does not know: the node ignores them, and one
// is most likely a misspelt setting (MESHBOX_NAT for MESHBOX_NATS).
func (d *Doctor) checkVariables(context.Context) Check {
	const name = "variables"
	unknown, err := appliance.UnknownEnvVars(d.envFile, d.environ)
	if err != nil {
		return warn(name, "", "%v", err)
	}
	if len(unknown) == 0 {
		return ok(name, "every MESHBOX_* variable set is one meshbox knows")
	}
	msgs := make([]string, len(unknown))
	for i, u := range unknown {
		msgs[i] = u.String()
	}
	return warn(name, "rename each to the variable meant (docs/configuration.md lists them): meshbox ignores a variable it does not know",
		"%s", strings.Join(msgs, "; "))
}
