package brokeradmin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"

	rabbithole "github.com/michaelklishin/rabbit-hole/v2"

	"github.com/meshbox/meshbox/internal/wire"
)

// DeclareStream declares the durable stream queue name with args (its
// retention: x-max-age, x-max-length-bytes, ...) and binds it to the
// mesh exchange with routing key key. A table of rows keeps its log in
// one (rows.<table>, key rows.<table>): the nodes' users may publish to
// it through mesh and read it, not make it. The mesh exchange must exist
// (DeclareMesh).
//
// A stream queue that exists is kept as it is (a node on a shared
// credential may have made it, or an operator changed its retention);
// its binding is declared again. A queue of that name that is not a
// stream is an error: a stream's readers could not read it.
func (a *Admin) DeclareStream(ctx context.Context, name, key string, args map[string]any) error {
	if name == "" || key == "" {
		return errors.New("declare stream: no queue name or routing key")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("declare stream queue %s: %w", name, err)
	}
	info, err := a.getQueue(a.vhost, name)
	var er rabbithole.ErrorResponse
	switch {
	case err == nil && info.Type != "stream":
		return fmt.Errorf("declare stream queue %s: it exists as a %s queue, not a stream; delete it (rabbitmqctl delete_queue -p %s %s) and declare it again",
			name, info.Type, a.vhost, name)
	case err == nil:
		// Kept as it is.
	case !errors.As(err, &er) || er.StatusCode != http.StatusNotFound:
		return a.explain("read queue "+name, err)
	default:
		if err := a.call(ctx, "declare stream queue "+name, func() (*http.Response, error) {
			// DeclareQueue writes the type into the arguments it is given.
			return a.c.DeclareQueue(a.vhost, name, rabbithole.QueueSettings{Type: "stream", Durable: true, Arguments: maps.Clone(args)})
		}); err != nil {
			return err
		}
	}
	return a.call(ctx, "bind stream queue "+name, func() (*http.Response, error) {
		return a.c.DeclareBinding(a.vhost, rabbithole.BindingInfo{Source: wire.MeshExchange,
			Destination: name, DestinationType: "queue", RoutingKey: key})
	})
}
