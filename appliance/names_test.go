package appliance

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestNamesAgree checks that config validation - the node's own name and
// the static routes - accepts exactly the names package names accepts, so
// a config that validates never names a capability or node another layer
// refuses.
func TestNamesAgree(t *testing.T) {
	for _, s := range namestest.Inputs() {
		checkConfigNames(t, s)
	}
	c := DefaultConfig()
	c.Bridge.Routes = map[string]string{"café": "alpha"}
	err := c.Validate()
	const want = `config: bridge.routes: capability name "café": byte 3 (0xc3) is not in [A-Za-z0-9_.-]`
	if err == nil || err.Error() != want {
		t.Fatalf("route cap.café: got %v, want %s", err, want)
	}
}

// FuzzConfigNames checks config validation and SanitizeNodeName against
// package names for any input.
func FuzzConfigNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	f.Fuzz(checkConfigNames)
}

func checkConfigNames(t *testing.T, s string) {
	t.Helper()
	nodeOK := names.Node(s) == nil
	capOK := names.Capability(s) == nil
	agree := func(what string, got, want bool) {
		t.Helper()
		if got != want {
			t.Fatalf("%s %q: appliance says valid=%v, package names says %v", what, s, got, want)
		}
	}
	agree("ValidNodeName", ValidNodeName(s), nodeOK)

	c := DefaultConfig()
	c.Node = s
	agree("node", !slices.Contains(invalidFields(t, c), "node"), nodeOK)

	c = DefaultConfig()
	c.Bridge.Routes = map[string]string{s: "alpha"}
	agree("bridge.routes capability", !slices.Contains(invalidFields(t, c), "bridge.routes"), capOK)

	c = DefaultConfig()
	c.Bridge.Routes = map[string]string{"echo": s}
	agree("bridge.routes node", !slices.Contains(invalidFields(t, c), "bridge.routes.echo"), nodeOK)

	if n := SanitizeNodeName(s); !ValidNodeName(n) {
		t.Fatalf("SanitizeNodeName(%q) = %q, not a valid node name", s, n)
	}
}

// invalidFields returns the fields c.Validate finds fault with.
func invalidFields(t *testing.T, c Config) []string {
	t.Helper()
	err := c.Validate()
	if err == nil {
		return nil
	}
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("got %v, want only *FieldError", e)
		}
		fields = append(fields, fe.Field)
		if strings.HasPrefix(fe.Field, "node") || strings.HasPrefix(fe.Field, "bridge.routes") {
			var ne *names.Error
			if !errors.As(e, &ne) {
				t.Fatalf("%s: got %v, want it to carry the *names.Error", fe.Field, e)
			}
		}
	}
	return fields
}
