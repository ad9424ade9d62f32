package doctor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"sort"
	"strings"

	"github.com/meshbox/meshbox/cache"
)

// multicastName reports whether host is a multicast DNS name (.local).
func multicastName(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	return h == "local" || strings.HasSuffix(h, ".local")
}

// urlHost returns the host name of a URL ("" when it has none).
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// checkMeshNames flags multicast DNS names (.local) for the database, the
// broker and any URL in the mesh settings: they resolve only on one LAN and
// only where mDNS works, a known cause of "works on one node only".
func (d *Doctor) checkMeshNames(context.Context) Check {
	const name = "mesh names"
	type named struct{ what, host string }
	var hosts []named
	if d.cfg.DB != "" {
		hosts = append(hosts, named{"database", urlHost(string(d.cfg.DB))})
	}
	if d.cfg.Broker != "" {
		hosts = append(hosts, named{"broker", urlHost(string(d.cfg.Broker))})
	} else if d.snap == nil && d.status != nil {
		// The running node holds the cache: the brokers it uses.
		for _, u := range append([]string{d.status.Broker.URL}, d.status.Broker.URLs...) {
			if h := urlHost(u); h != "" {
				hosts = append(hosts, named{"broker", h})
			}
		}
	}
	if d.snap != nil {
		keys := make([]string, 0, len(d.snap.Bindings.Settings))
		for k := range d.snap.Bindings.Settings {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if h := urlHost(d.snap.Bindings.Settings[k]); h != "" {
				hosts = append(hosts, named{"setting " + k, h})
			}
		}
	}
	var bad []string
	for _, h := range hosts {
		if multicastName(h.host) {
			bad = append(bad, fmt.Sprintf("%s host %s", h.what, h.host))
		}
	}
	if len(bad) > 0 {
		return fail(name, "use names every node resolves the same way: the overlay (VPN) name or a DNS name, not mDNS",
			"%s: multicast DNS (.local) names resolve only on one network, so other nodes cannot reach them", strings.Join(bad, ", "))
	}
	if len(hosts) == 0 {
		return ok(name, "no database or broker names to check")
	}
	var list []string
	for _, h := range hosts {
		list = append(list, h.host)
	}
	return ok(name, "no multicast (.local) names: %s", strings.Join(dedupe(list), ", "))
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// hostsEntry is one name on one line of a hosts file.
type hostsEntry struct {
	Line    int
	Address string
}

// findInHosts returns the lines of a hosts file (r) that map name.
func findInHosts(r io.Reader, name string) ([]hostsEntry, error) {
	want := strings.TrimSuffix(strings.ToLower(name), ".")
	var out []hostsEntry
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		for _, f := range fields[1:] {
			if strings.TrimSuffix(strings.ToLower(f), ".") == want {
				out = append(out, hostsEntry{Line: n, Address: fields[0]})
				break
			}
		}
	}
	return out, sc.Err()
}

// checkHostsFile: this node's public name must not be pinned in the local
// hosts file. A pinned name (Debian maps the host's own name to 127.0.1.1)
// makes the node resolve itself differently from everyone else.
func (d *Doctor) checkHostsFile(context.Context) Check {
	const name = "hosts file"
	public, from := d.publicName, "--public-name"
	known := public != "" // whether doctor knows the node's public name, which may be none
	switch {
	case public != "":
	case d.snap != nil:
		known = true
		if rec, ok := d.snap.Bindings.NodeRecord(d.cfg.Node); ok && rec.PublicName != "" {
			public, from = rec.PublicName, "the node record"
		}
	case d.status != nil && d.status.Bindings.Source != cache.SourceNone:
		// The running node holds the cache: its own word.
		known = true
		public, from = d.status.PublicName, "the running node's record"
	}
	if !known {
		return ok(name, "public name not known (no bindings to read it from); pass --public-name to check it")
	}
	if public == "" {
		return ok(name, "node %s has no public name", d.cfg.Node)
	}
	f, err := os.Open(d.hostsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return ok(name, "no hosts file at %s", d.hostsFile)
	}
	if err != nil {
		return warn(name, "", "%s: %v", d.hostsFile, err)
	}
	defer f.Close()
	found, err := findInHosts(f, public)
	if err != nil {
		return warn(name, "", "%s: %v", d.hostsFile, err)
	}
	if len(found) > 0 {
		var where []string
		for _, e := range found {
			where = append(where, fmt.Sprintf("line %d: %s", e.Line, e.Address))
		}
		return fail(name, fmt.Sprintf("remove %s from %s; let DNS answer for it like it does for every other node", public, d.hostsFile),
			"this node's public name %s (from %s) is pinned in %s (%s)", public, from, d.hostsFile, strings.Join(where, ", "))
	}
	return ok(name, "this node's public name %s is not pinned in %s", public, d.hostsFile)
}
