package cache

import "github.com/meshbox/meshbox/internal/redact"

// Redacted returns a copy of b that can be shown to anyone: grant
// credentials and the node's broker and database passwords masked,
// secret-looking setting and override values masked and the passwords of
// URLs in the others hidden (package redact). b is not changed. `meshbox cache show` prints this
// unless asked to --reveal.
func (b Bindings) Redacted() Bindings {
	out := b
	out.Settings = make(map[string]string, len(b.Settings))
	for k, v := range b.Settings {
		out.Settings[k] = redact.Value(k, v)
	}
	out.Overrides = make([]Override, len(b.Overrides))
	for i, o := range b.Overrides {
		o.Value = redact.Value(o.Key, o.Value)
		out.Overrides[i] = o
	}
	out.Grants = make([]Grant, len(b.Grants))
	for i, g := range b.Grants {
		if g.Credential != "" {
			g.Credential = redact.Mask
		}
		out.Grants[i] = g
	}
	if b.Broker != nil {
		bc := *b.Broker
		if bc.Password != "" {
			bc.Password = redact.Mask
		}
		if bc.DBPassword != "" {
			bc.DBPassword = redact.Mask
		}
		out.Broker = &bc
	}
	out.Nodes = make([]NodeRecord, len(b.Nodes))
	for i, n := range b.Nodes {
		n.Identity = redact.Text(n.Identity)
		out.Nodes[i] = n
	}
	return out
}
