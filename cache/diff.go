package cache

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kinds of rows a Change can be about.
const (
	KindNode       = "node"
	KindSetting    = "setting"
	KindAssignment = "assignment"
	KindOverride   = "override"
	KindGrant      = "grant"
	KindBroker     = "broker_credential"
)

// Operations a Change reports.
const (
	OpAdded   = "added"
	OpRemoved = "removed"
	OpChanged = "changed"
)

// Change is one row that differs between two versions of the bindings.
// Old and New describe the row before and after; they never carry a
// credential, and secret-looking values are redacted.
type Change struct {
	Kind string `json:"kind"`          // node, setting, assignment, override, grant, broker_credential
	Op   string `json:"op"`            // added, removed, changed
	Key  string `json:"key"`           // node name, setting key, module, module/key, consumer:resource@provider
	Old  string `json:"old,omitempty"` // the row before (empty when added)
	New  string `json:"new,omitempty"` // the row after (empty when removed)
}

// String renders the change on one line, e.g.
// `setting broker.url changed: "amqp://a" -> "amqp://b"`.
func (c Change) String() string {
	switch c.Op {
	case OpAdded:
		if c.New == "" {
			return fmt.Sprintf("%s %s added", c.Kind, c.Key)
		}
		return fmt.Sprintf("%s %s added: %s", c.Kind, c.Key, c.New)
	case OpRemoved:
		if c.Old == "" {
			return fmt.Sprintf("%s %s removed", c.Kind, c.Key)
		}
		return fmt.Sprintf("%s %s removed (was %s)", c.Kind, c.Key, c.Old)
	default:
		return fmt.Sprintf("%s %s changed: %s -> %s", c.Kind, c.Key, c.Old, c.New)
	}
}

// Divergence lists the rows that differ between two versions of the
// bindings, ordered by kind (node, setting, assignment, override, grant,
// broker_credential)
// and then key.
type Divergence []Change

// Empty reports whether nothing differs.
func (d Divergence) Empty() bool { return len(d) == 0 }

// Summary counts the changes, e.g. "1 added, 2 changed" or "no changes".
func (d Divergence) Summary() string {
	var added, removed, changed int
	for _, c := range d {
		switch c.Op {
		case OpAdded:
			added++
		case OpRemoved:
			removed++
		default:
			changed++
		}
	}
	var parts []string
	if added > 0 {
		parts = append(parts, fmt.Sprintf("%d added", added))
	}
	if removed > 0 {
		parts = append(parts, fmt.Sprintf("%d removed", removed))
	}
	if changed > 0 {
		parts = append(parts, fmt.Sprintf("%d changed", changed))
	}
	if len(parts) == 0 {
		return "no changes"
	}
	return strings.Join(parts, ", ")
}

// Strings renders every change with Change.String.
func (d Divergence) Strings() []string {
	out := make([]string, len(d))
	for i, c := range d {
		out[i] = c.String()
	}
	return out
}

// LogValue renders the divergence as its summary and its changes.
func (d Divergence) LogValue() slog.Value {
	return slog.GroupValue(slog.String("summary", d.Summary()), slog.Any("changes", d.Strings()))
}

// Diff compares two versions of the bindings row by row. Rows are matched
// by key: nodes by name, settings by key, assignments by module, overrides
// by module and key, grants by consumer, resource and provider. A grant
// whose credential differs is reported as changed without its value.
func Diff(old, new Bindings) Divergence {
	o, n := old.Normalize(), new.Normalize()
	var d Divergence

	d = diffRows(d, KindNode, nodeRows(o.Nodes), nodeRows(n.Nodes),
		func(r nodeRow) string { return r.name },
		func(r nodeRow) string { return r.describe() })

	oldKeys := make([]kv, 0, len(o.Settings))
	for _, k := range sortedKeys(o.Settings) {
		oldKeys = append(oldKeys, kv{k, o.Settings[k]})
	}
	newKeys := make([]kv, 0, len(n.Settings))
	for _, k := range sortedKeys(n.Settings) {
		newKeys = append(newKeys, kv{k, n.Settings[k]})
	}
	d = diffRows(d, KindSetting, oldKeys, newKeys,
		func(r kv) string { return r.k },
		func(r kv) string { return fmt.Sprintf("%q", displayValue(r.k, r.v)) })

	d = diffRows(d, KindAssignment, o.Assignments, n.Assignments,
		func(r Assignment) string { return r.Module },
		func(r Assignment) string { return fmt.Sprintf("selection=%q autostart=%t", r.Selection, r.Autostart) })

	d = diffRows(d, KindOverride, o.Overrides, n.Overrides,
		func(r Override) string { return r.Module + "/" + r.Key },
		func(r Override) string { return fmt.Sprintf("%q", displayValue(r.Key, r.Value)) })

	// Grants: names only; a rotated credential shows as a change that says
	// so without the value.
	d = diffRows(d, KindGrant, o.Grants, n.Grants,
		func(r Grant) string { return r.key() },
		func(r Grant) string {
			if r.SealedCredential != "" {
				return "credential sealed"
			}
			return describeCredential(r.Credential)
		})

	// The node's broker credential: user and generation, never the
	// password.
	var ob, nb []brokerRow
	if o.Broker != nil {
		ob = append(ob, rowOf(*o.Broker))
	}
	if n.Broker != nil {
		nb = append(nb, rowOf(*n.Broker))
	}
	d = diffRows(d, KindBroker, ob, nb,
		func(brokerRow) string { return n.Node },
		func(r brokerRow) string { return r.describe() })
	return d
}

// brokerRow is a BrokerCredential in comparable form.
type brokerRow struct {
	user              string
	generation        int
	password          Credential
	created, switched time.Time
	older             string
	dbRole            string
	dbPassword        Credential
}

func rowOf(c BrokerCredential) brokerRow {
	return brokerRow{user: c.User, generation: c.Generation, password: c.Password,
		created: c.CreatedAt, switched: c.SwitchedAt, older: fmt.Sprint(c.Older), dbRole: c.DBRole, dbPassword: c.DBPassword}
}

func (r brokerRow) describe() string {
	s := fmt.Sprintf("user=%s generation=%d", r.user, r.generation)
	if r.dbRole != "" {
		s += " db_role=" + r.dbRole
	}
	if !r.switched.IsZero() {
		s += " switched"
	}
	if r.older != "[]" {
		s += " older=" + r.older
	}
	return s
}

type kv struct{ k, v string }

func describeCredential(c Credential) string {
	if c == "" {
		return "no credential"
	}
	return "credential " + redacted
}

// nodeRow is a NodeRecord in comparable form: its generations as text.
type nodeRow struct {
	name, publicName, identity, publicKey, signingKey, generations string
}

func nodeRows(rs []NodeRecord) []nodeRow {
	out := make([]nodeRow, len(rs))
	for i, r := range rs {
		gens := make([]string, len(r.Generations))
		for j, g := range r.Generations {
			gens[j] = strconv.Itoa(g)
		}
		out[i] = nodeRow{name: r.Name, publicName: r.PublicName, identity: r.Identity, publicKey: r.PublicKey, signingKey: r.SigningKey,
			generations: strings.Join(gens, ",")}
	}
	return out
}

func (r nodeRow) describe() string {
	id := r.identity
	if len(id) > 64 {
		id = id[:64] + "..."
	}
	key := ""
	if r.publicKey != "" {
		key = " public_key=set"
	}
	if r.signingKey != "" {
		key += " signing_key=set"
	}
	if r.generations != "" {
		key += " generations=" + r.generations
	}
	return fmt.Sprintf("public_name=%q identity=%q%s", r.publicName, id, key)
}

// diffRows sorts two lists by key, merges them and appends the differences.
// Rows with the same key are compared in full (==); desc renders them for
// the report. When two differing rows render alike (a rotated credential,
// a redacted value), the report marks them old and new.
func diffRows[T comparable](d Divergence, kind string, old, new []T, key func(T) string, desc func(T) string) Divergence {
	old = slices.SortedFunc(slices.Values(old), func(a, b T) int { return strings.Compare(key(a), key(b)) })
	new = slices.SortedFunc(slices.Values(new), func(a, b T) int { return strings.Compare(key(a), key(b)) })
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j >= len(new) || i < len(old) && key(old[i]) < key(new[j]):
			d = append(d, Change{Kind: kind, Op: OpRemoved, Key: key(old[i]), Old: desc(old[i])})
			i++
		case i >= len(old) || key(new[j]) < key(old[i]):
			d = append(d, Change{Kind: kind, Op: OpAdded, Key: key(new[j]), New: desc(new[j])})
			j++
		default:
			if old[i] != new[j] {
				c := Change{Kind: kind, Op: OpChanged, Key: key(old[i]), Old: desc(old[i]), New: desc(new[j])}
				if c.Old == c.New {
					c.Old, c.New = c.Old+" (old)", c.New+" (new)"
				}
				d = append(d, c)
			}
			i++
			j++
		}
	}
	return d
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
