package codec

import (
	"maps"

	"github.com/nats-io/nats.go"
)

// NodeCommandHeaders are the node headers a command's record keeps among
// its caller headers until it is published (outgoingFor moves them out of
// the seal).
var NodeCommandHeaders = []string{HeaderResultTopic, HeaderReplayed, HeaderFirstOrigin}

// SplitNodeHeaders moves the node headers out of h into meta, copying
// both when there is one to move.
func SplitNodeHeaders(h nats.Header, meta map[string]string) (nats.Header, map[string]string) {
	var out nats.Header
	for _, k := range NodeCommandHeaders {
		v := h.Get(k)
		if v == "" {
			continue
		}
		if out == nil {
			out = maps.Clone(h)
			meta = maps.Clone(meta)
			if meta == nil {
				meta = map[string]string{}
			}
		}
		delete(out, k)
		meta[k] = v
	}
	if out == nil {
		return h, meta
	}
	return out, meta
}
