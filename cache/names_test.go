package cache_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshbox/meshbox/cache"
	"github.com/meshbox/meshbox/internal/names"
	"github.com/meshbox/meshbox/internal/names/namestest"
)

// TestNamesAgree checks that the cache's validation of the names in the
// bindings - what meshdb runs before every write and the manager on its
// node - accepts exactly the names package names accepts, and that every
// rejection is a *NameError carrying the *names.Error.
func TestNamesAgree(t *testing.T) {
	for _, s := range namestest.Inputs() {
		checkCacheNames(t, s)
	}
	err := cache.ValidateModuleName("café")
	var ne *names.Error
	if !errors.Is(err, cache.ErrInvalidName) || !errors.As(err, &ne) || ne.Pos != 3 {
		t.Fatalf("module café: got %v, want ErrInvalidName with the fault at byte 3", err)
	}
	const want = `invalid module name "café": byte 3 (0xc3) is not in [A-Za-z0-9_.-]`
	if err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
}

// FuzzCacheNames checks the cache's name validation against package names
// for any input.
func FuzzCacheNames(f *testing.F) {
	for _, s := range namestest.Inputs() {
		f.Add(s)
	}
	f.Fuzz(checkCacheNames)
}

func checkCacheNames(t *testing.T, s string) {
	t.Helper()
	for _, c := range []struct {
		kind  names.Kind
		check func(string) error
	}{
		{names.KindNode, cache.ValidateNodeName},
		{names.KindModule, cache.ValidateModuleName},
		{names.KindSettingKey, cache.ValidateSettingKey},
		{names.KindOverrideKey, cache.ValidateOverrideKey},
		{names.KindResource, func(s string) error { return cache.ValidateResourceName("resource", s) }},
		{names.KindProvider, func(s string) error { return cache.ValidateResourceName("provider", s) }},
		{names.KindPublicName, cache.ValidatePublicName},
	} {
		got, want := c.check(s), names.Check(c.kind, s)
		if c.kind == names.KindPublicName && s == "" {
			want = nil // a public name is optional
		}
		if (got == nil) != (want == nil) {
			t.Fatalf("%s %q: cache says %v, package names says %v", c.kind, s, got, want)
		}
		if got == nil {
			continue
		}
		var ce *cache.NameError
		var ne *names.Error
		if !errors.Is(got, cache.ErrInvalidName) || !errors.As(got, &ce) || !errors.As(got, &ne) || ne.Kind != c.kind {
			t.Fatalf("%s %q: got %v, want a *cache.NameError wrapping ErrInvalidName and a *names.Error", c.kind, s, got)
		}
	}
	_, err := cache.NewManager(cache.ManagerConfig{Node: s})
	if errors.Is(err, cache.ErrInvalidName) != (names.Node(s) != nil) {
		t.Fatalf("NewManager node %q: got %v, package names says %v", s, err, names.Node(s))
	}
}

func TestValidateBrokerURL(t *testing.T) {
	for _, tt := range []struct {
		raw  string
		want string // a piece of the error; "" for none
	}{
		{"amqp://b1:5672/mesh", ""},
		{"amqps://b1/mesh,amqps://b2/mesh, amqps://b3:5671/mesh", ""},
		{"", "empty"},
		{"http://b1/", "scheme"},
		{"amqp://b1/mesh,", "URL 2 of 2 is empty"},
		{"amqp://b1/mesh,http://b2/mesh", "scheme"},
		{"amqp://b1/mesh,amqp://u:topsecret@b2/mesh", "holds a password"},
		{"amqp://b1/mesh,amqp://b2/other", "vhost"},
	} {
		err := cache.ValidateBrokerURL(tt.raw)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("ValidateBrokerURL(%q): got %v, want nil", tt.raw, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("ValidateBrokerURL(%q): got %v, want an error saying %q", tt.raw, err, tt.want)
		case err != nil && strings.Contains(err.Error(), "topsecret"):
			t.Errorf("ValidateBrokerURL(%q): the error repeats the password: %v", tt.raw, err)
		}
	}
}
