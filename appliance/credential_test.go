package appliance

import (
	"strings"
	"testing"
	"time"

	"github.com/meshbox/meshbox/bridge"
	"github.com/meshbox/meshbox/cache"
)

func TestIdentityStatus(t *testing.T) {
	now := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	created := now.Add(-time.Hour)
	inUse := func(user string, gen int) *bridge.CredentialStatus {
		return &bridge.CredentialStatus{User: user, Generation: gen, State: bridge.CredentialInUse}
	}
	tests := []struct {
		name      string
		link      *bridge.CredentialStatus
		newest    *cache.BrokerCredential
		wantGen   int
		wantState string
		wantAge   float64
		rotation  string // substring; "" means none
	}{
		{"nothing known", nil, nil, 0, "", 0, ""},
		{"no broker (standalone)", &bridge.CredentialStatus{State: bridge.CredentialUnused}, nil, 0, "", 0, ""},
		{"settled", inUse("node.a.g2", 2), &cache.BrokerCredential{Generation: 2, User: "node.a.g2", CreatedAt: created, SwitchedAt: now},
			2, bridge.CredentialInUse, 3600, ""},
		{"new generation not taken yet", inUse("node.a.g2", 2), &cache.BrokerCredential{Generation: 3, User: "node.a.g3", CreatedAt: now, Older: []int{2}},
			2, bridge.CredentialInUse, 0, "generation 3 recorded; switching to it from node.a.g2"},
		{"switched, not recorded", inUse("node.a.g3", 3), &cache.BrokerCredential{Generation: 3, User: "node.a.g3", CreatedAt: created, Older: []int{2}},
			3, bridge.CredentialInUse, 3600, "recording the switch"},
		{"switched, old not revoked", inUse("node.a.g3", 3), &cache.BrokerCredential{Generation: 3, User: "node.a.g3", CreatedAt: created, SwitchedAt: now, Older: []int{2}},
			3, bridge.CredentialInUse, 3600, "older generations [2] still valid"},
		{"revoked", &bridge.CredentialStatus{User: "node.a.g1", Generation: 1, State: bridge.CredentialRevoked}, &cache.BrokerCredential{Generation: 1, User: "node.a.g1", CreatedAt: created},
			1, bridge.CredentialRevoked, 3600, ""},
		{"not connected yet", nil, &cache.BrokerCredential{Generation: 1, User: "node.a.g1", CreatedAt: created},
			1, bridge.CredentialUnused, 3600, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := identity(tt.link, tt.newest, now)
			if (tt.link == nil || tt.link.User == "") && tt.newest == nil {
				if id != nil {
					t.Fatalf("got %+v, want nil", *id)
				}
				return
			}
			if id.Generation != tt.wantGen || id.State != tt.wantState || id.AgeSeconds != tt.wantAge {
				t.Errorf("got generation %d state %q age %v, want %d %q %v", id.Generation, id.State, id.AgeSeconds, tt.wantGen, tt.wantState, tt.wantAge)
			}
			if (tt.rotation == "") != (id.Rotation == "") || !strings.Contains(id.Rotation, tt.rotation) {
				t.Errorf("rotation: got %q, want %q", id.Rotation, tt.rotation)
			}
		})
	}
}
