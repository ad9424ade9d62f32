package node

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// ServerSubjects returns a Config.LocalSubjects function that reads, from
// the embedded server srv, the cap.* and work.* subjects its client
// connections subscribe to (plain, queue group or NATS micro endpoint
// alike). Connections whose name starts with excludeNamePrefix are
// skipped: the appliance and bridge name their own connections so
// ("meshbox-..."), which keeps the stand-ins from counting as local hosts.
// The function is safe for concurrent use.
func ServerSubjects(srv *server.Server, excludeNamePrefix string) func() ([]string, error) {
	return func() ([]string, error) {
		const page = 1024
		var out []string
		for offset := 0; ; offset += page {
			cz, err := srv.Connz(&server.ConnzOptions{Subscriptions: true, Offset: offset, Limit: page, State: server.ConnOpen})
			if err != nil {
				return nil, fmt.Errorf("read server connections: %w", err)
			}
			for _, ci := range cz.Conns {
				if excludeNamePrefix != "" && strings.HasPrefix(ci.Name, excludeNamePrefix) {
					continue
				}
				for _, s := range ci.Subs {
					if strings.HasPrefix(s, capSubjectPrefix) || strings.HasPrefix(s, workSubjectPrefix) {
						out = append(out, s)
					}
				}
			}
			if len(cz.Conns) < page || offset+len(cz.Conns) >= cz.Total {
				return out, nil
			}
		}
	}
}
