package brokeradmin

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/meshbox/meshbox/internal/wire"
)

// Password is a broker password. It prints redacted in logs, fmt and JSON;
// Reveal returns the value.
type Password string

// String returns "xxxxx" (or "" for no password).
func (p Password) String() string {
	if p == "" {
		return ""
	}
	return "xxxxx"
}

// LogValue returns the redacted form for slog.
func (p Password) LogValue() slog.Value { return slog.StringValue(p.String()) }

// MarshalJSON writes the redacted form.
func (p Password) MarshalJSON() ([]byte, error) { return []byte(`"` + p.String() + `"`), nil }

// Reveal returns the password itself.
func (p Password) Reveal() string { return string(p) }

// Credential is one generation of a node's broker credential.
type Credential struct {
	Node       string
	Generation int
	User       string // wire.BrokerUser(Node, Generation)
	Password   Password
}

// NewPassword returns a random password: 32 bytes from crypto/rand,
// base64url without padding (43 characters, safe in URLs).
func NewPassword() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

// DeclareMesh declares what all nodes share and none may delete: the vhost,
// exchanges mesh and mesh.dlx, and queue mesh.dead bound to mesh.dlx with
// "#". Declaring what exists with the same properties changes nothing.
func (a *Admin) DeclareMesh(ctx context.Context) error {
	steps := []struct {
		what string
		do   func() (*http.Response, error)
	}{
		{"vhost " + a.vhost, func() (*http.Response, error) { return a.c.PutVhost(a.vhost, rabbithole.VhostSettings{}) }},
		{"exchange " + wire.MeshExchange, func() (*http.Response, error) {
			return a.c.DeclareExchange(a.vhost, wire.MeshExchange, rabbithole.ExchangeSettings{Type: "topic", Durable: true})
		}},
		{"exchange " + wire.DeadLetterExchange, func() (*http.Response, error) {
			return a.c.DeclareExchange(a.vhost, wire.DeadLetterExchange, rabbithole.ExchangeSettings{Type: "topic", Durable: true})
		}},
		{"queue " + wire.DeadLetterQueue, func() (*http.Response, error) {
			// A quorum queue, reachable with any node of a cluster down. An
			// older mesh's classic one is kept: declaring it with another
			// type would fail.
			if _, err := a.getQueue(a.vhost, wire.DeadLetterQueue); err == nil {
				return &http.Response{Body: http.NoBody}, nil
			}
			return a.c.DeclareQueue(a.vhost, wire.DeadLetterQueue, rabbithole.QueueSettings{Type: "quorum", Durable: true})
		}},
		{"binding " + wire.DeadLetterQueue, func() (*http.Response, error) {
			return a.c.DeclareBinding(a.vhost, rabbithole.BindingInfo{Source: wire.DeadLetterExchange,
				Destination: wire.DeadLetterQueue, DestinationType: "queue", RoutingKey: "#"})
		}},
	}
	for _, st := range steps {
		if err := a.call(ctx, "declare "+st.what, st.do); err != nil {
			return err
		}
	}
	return nil
}

// CreateGeneration creates (or, if it exists, resets) the broker user of
// generation gen of node's credential with a new random password and no
// tags, gives it wire.NodePermissions for the stage allow-list on the
// vhost, sets its user limits (wire.NodeLimits) and declares the node's
// durable queues (DeclareNodeQueues). The vhost must exist (DeclareMesh).
// The node binds its own queues to mesh; an older mesh's exchange
// node.<n> stays until the node has switched to this generation
// (DropNodeExchange): a node on that mesh's permissions routes through it.
func (a *Admin) CreateGeneration(ctx context.Context, node string, gen int, stages []string) (Credential, error) {
	if gen < 1 {
		return Credential{}, fmt.Errorf("create broker user: generation %d: must be 1 or more", gen)
	}
	perms, err := wire.NodePermissions(node, stages)
	if err != nil {
		return Credential{}, fmt.Errorf("create broker user: %w", err)
	}
	if err := a.checkVhost(ctx); err != nil {
		return Credential{}, err
	}
	cred := Credential{Node: node, Generation: gen, User: wire.BrokerUser(node, gen), Password: Password(NewPassword())}
	steps := []struct {
		what string
		do   func() (*http.Response, error)
	}{
		{"create user " + cred.User, func() (*http.Response, error) {
			// The broker gets only the password's salted hash.
			return a.c.PutUser(cred.User, rabbithole.UserSettings{Tags: rabbithole.UserTags{},
				PasswordHash:     rabbithole.Base64EncodedSaltedPasswordHashSHA256(cred.Password.Reveal()),
				HashingAlgorithm: rabbithole.HashingAlgorithmSHA256})
		}},
		{"permissions of " + cred.User, func() (*http.Response, error) {
			return a.c.UpdatePermissionsIn(a.vhost, cred.User, rabbithole.Permissions{
				Configure: perms.Configure, Write: perms.Write, Read: perms.Read})
		}},
		{"topic permissions of " + cred.User, func() (*http.Response, error) {
			return a.c.UpdateTopicPermissionsIn(a.vhost, cred.User, rabbithole.TopicPermissions{
				Exchange: perms.TopicExchange, Write: perms.TopicWrite, Read: perms.TopicRead})
		}},
		{"limits of " + cred.User, func() (*http.Response, error) { return a.putLimits(cred.User) }},
	}
	for _, st := range steps {
		if err := a.call(ctx, st.what, st.do); err != nil {
			return Credential{}, err
		}
	}
	if err := a.DeclareNodeQueues(ctx, node, stages); err != nil {
		return Credential{}, err
	}
	return cred, nil
}

// DeclareNodeQueues declares node's durable queues (wire.NodeQueues)
// and binds them to mesh: with the current permissions the node may
// only find them. A queue that exists is kept as it is (a node of an
// older version declared it, with arguments of its own); its binding is
// declared again.
func (a *Admin) DeclareNodeQueues(ctx context.Context, node string, stages []string) error {
	specs, err := wire.NodeQueues(node, stages)
	if err != nil {
		return fmt.Errorf("declare node queues: %w", err)
	}
	for _, q := range specs {
		if err := a.call(ctx, "declare queue "+q.Name, func() (*http.Response, error) {
			info, err := a.getQueue(a.vhost, q.Name)
			var er rabbithole.ErrorResponse
			switch {
			case err == nil && info.Arguments["x-expires"] != nil && info.Messages == 0 && info.Consumers == 0:
				// A node declared it itself, expiring: once the broker
				// deleted it the node could not declare it again
				// (NodeQueues). Empty and unused, it is replaced.
				if _, err := a.c.DeleteQueue(a.vhost, q.Name, rabbithole.QueueDeleteOptions{IfEmpty: true, IfUnused: true}); err != nil {
					return nil, err
				}
			case err == nil:
				return &http.Response{Body: http.NoBody}, nil // kept as it is
			case !errors.As(err, &er) || er.StatusCode != http.StatusNotFound:
				return nil, err
			}
			typ, _ := q.Args["x-queue-type"].(string)
			return a.c.DeclareQueue(a.vhost, q.Name, rabbithole.QueueSettings{Type: typ, Durable: true, Arguments: q.Args})
		}); err != nil {
			return err
		}
		if q.Key == "" {
			continue // bound by its node (the event queue, for what its programs listen to)
		}
		if err := a.call(ctx, "bind queue "+q.Name, func() (*http.Response, error) {
			return a.c.DeclareBinding(a.vhost, rabbithole.BindingInfo{Source: wire.MeshExchange,
				Destination: q.Name, DestinationType: "queue", RoutingKey: q.Key})
		}); err != nil {
			return err
		}
	}
	return nil
}

// DeleteNodeQueues deletes node's own durable queue, its event queue (a
// stage's queues are shared with the other nodes of the stage). A queue
// that does not exist is not an error.
func (a *Admin) DeleteNodeQueues(ctx context.Context, node string) error {
	specs, err := wire.NodeQueues(node, nil)
	if err != nil {
		return fmt.Errorf("delete node queues: %w", err)
	}
	for _, q := range specs {
		if err := a.call(ctx, "delete queue "+q.Name, func() (*http.Response, error) {
			resp, err := a.c.DeleteQueue(a.vhost, q.Name)
			var er rabbithole.ErrorResponse
			if errors.As(err, &er) && er.StatusCode == http.StatusNotFound {
				return &http.Response{Body: http.NoBody}, nil
			}
			return resp, err
		}); err != nil {
			return err
		}
	}
	return nil
}

// DropNodeExchange deletes an older mesh's exchange node.<n>, which the
// node itself may not delete with the current permissions: once the node
// runs on a generation with them (until then its queues may be bound
// through it). One that does not exist is not an error.
func (a *Admin) DropNodeExchange(ctx context.Context, node string) error {
	ex := wire.NodeExchange(node)
	return a.call(ctx, "delete exchange "+ex, func() (*http.Response, error) {
		resp, err := a.c.DeleteExchange(a.vhost, ex)
		var er rabbithole.ErrorResponse
		if errors.As(err, &er) && er.StatusCode == http.StatusNotFound {
			return &http.Response{Body: http.NoBody}, nil
		}
		return resp, err
	})
}

// SetStages replaces the permissions of an existing generation's user for
// a new stage allow-list, and declares the queues of the stages added
// (DeclareNodeQueues).
func (a *Admin) SetStages(ctx context.Context, node string, gen int, stages []string) error {
	perms, err := wire.NodePermissions(node, stages)
	if err != nil {
		return fmt.Errorf("set broker permissions: %w", err)
	}
	user := wire.BrokerUser(node, gen)
	if err := a.call(ctx, "permissions of "+user, func() (*http.Response, error) {
		return a.c.UpdatePermissionsIn(a.vhost, user, rabbithole.Permissions{Configure: perms.Configure, Write: perms.Write, Read: perms.Read})
	}); err != nil {
		return err
	}
	if err := a.call(ctx, "topic permissions of "+user, func() (*http.Response, error) {
		return a.c.UpdateTopicPermissionsIn(a.vhost, user, rabbithole.TopicPermissions{
			Exchange: perms.TopicExchange, Write: perms.TopicWrite, Read: perms.TopicRead})
	}); err != nil {
		return err
	}
	return a.DeclareNodeQueues(ctx, node, stages)
}

// SetLimits sets the user limits (wire.NodeLimits) of an existing
// generation's user: for a user made before limits existed.
func (a *Admin) SetLimits(ctx context.Context, node string, gen int) error {
	user := wire.BrokerUser(node, gen)
	return a.call(ctx, "limits of "+user, func() (*http.Response, error) { return a.putLimits(user) })
}

// putLimits sets wire.NodeLimits on user.
func (a *Admin) putLimits(user string) (*http.Response, error) {
	l := wire.NodeLimits()
	return a.c.PutUserLimits(user, rabbithole.UserLimitsValues{
		"max-connections": l.MaxConnections, "max-channels": l.MaxChannels})
}

// DeleteGeneration deletes the broker user of generation gen of node's
// credential; the broker closes its connections. A user that does not
// exist is not an error.
func (a *Admin) DeleteGeneration(ctx context.Context, node string, gen int) error {
	user := wire.BrokerUser(node, gen)
	return a.call(ctx, "delete user "+user, func() (*http.Response, error) { return a.c.DeleteUser(user) })
}

// Generations returns the generations of node's credential that have a
// broker user, oldest first.
func (a *Admin) Generations(ctx context.Context, node string) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	users, err := a.c.ListUsers()
	if err != nil {
		return nil, a.explain("list users", err)
	}
	var gens []int
	for _, u := range users {
		if n, g, ok := wire.ParseBrokerUser(u.Name); ok && n == node {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

// checkVhost fails with ErrNoVhost if the Admin's vhost does not exist.
func (a *Admin) checkVhost(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := a.c.GetVhost(a.vhost)
	var resp rabbithole.ErrorResponse
	if errors.As(err, &resp) && resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("broker admin %s: vhost %q: %w (run meshbox init with --broker-admin)", a.endpoint, a.vhost, ErrNoVhost)
	}
	if err != nil {
		return a.explain("check vhost", err)
	}
	return nil
}

// getQueue reads a queue. The management API may describe a consumer
// whose channel is closing with channel_details [] where an object belongs,
// which its client cannot decode, until its statistics are next collected
// (every 5 s by default): such a read is tried again, after pauses that
// together outlast that (getQueuePauses).
func (a *Admin) getQueue(vhost, name string) (*rabbithole.DetailedQueueInfo, error) {
	for i := 0; ; i++ {
		info, err := a.c.GetQueue(vhost, name)
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) || i == len(getQueuePauses) {
			return info, err
		}
		time.Sleep(getQueuePauses[i])
	}
}

// getQueuePauses are getQueue's pauses between reads (5.5 s in all).
var getQueuePauses = []time.Duration{250 * time.Millisecond, 750 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second}

// call runs one management API call unless ctx is done, and closes the
// response body.
func (a *Admin) call(ctx context.Context, op string, do func() (*http.Response, error)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	resp, err := do()
	if err != nil {
		return a.explain(op, err)
	}
	resp.Body.Close()
	return nil
}
